/*
 * Per (slot, set), which workers have contributed to its round.
 *
 * TNA form of v1model/control/bitmap_checker.p4, with one difference: a register word
 * per (slot, set) holds its bitmap and its round's packet id (a 2 x 32-bit pair, one
 * stateful ALU in dual mode), and the first packet of a newer round starts the set
 * over. v1model re-arms instead (contributing to set s clears the sender's bit in set
 * 1-s, one word per slot), and tracks ids only for deadline jobs (round_tracker.p4);
 * a set started over by its round's id is the same for workers that go in step, and
 * is what a deadline job needs: its workers go on without a late one, whose bits from
 * older rounds must not count in newer ones. A packet behind the set's round (stale)
 * marks nobody; RoundTracker's `ages` says so, to the tables after this one.
 *
 * A stateful ALU returns one word: the set's bitmap as it was before the packet
 * (bitmap_before; 0 for a packet that starts the round). v1model's seen (the sender's
 * bit set in it) and first (bitmap_before == 0) are not computed here: the tables
 * that need them (ContributionCounter, ValuePair, ExponentMax, FingerprintSum) match
 * (worker_id, bitmap_before) directly, one entry per worker (FOR_EACH_WORKER), in the
 * stage right after this one; computing seen would cost a stage.
 * ContributionCounter writes meta.seen / meta.first.
 *
 * The same table also admits the packet: its key holds every check v1model makes
 * with if/else before its bitmap (loss draw, parser error, length, message type, a
 * deadline for RELEASE and QUORUM, job, slot range, sender), and its entries, first
 * match wins, take them in v1model's order, so a packet failing several is counted
 * under the same outcome. The 35 stateful ALUs after the bitmap need nine of the
 * twelve stages, so the bitmap must sit in stage 2, right after the lookups (0) and
 * the loss draw (1): a gateway chain, or a separate admission table, would cost a
 * stage before it. Every action writes `aggregate`, `harvest`, `release` and `quorum`,
 * which the register tables after it key on, and whether it counts a deadline outcome.
 */
#ifndef _TNA_BITMAP_CHECKER_P4_
#define _TNA_BITMAP_CHECKER_P4_

#if (POOL_SIZE & (POOL_SIZE - 1)) != 0
#error "POOL_SIZE must be a power of two: slot < POOL_SIZE is matched as its high bits being 0"
#endif

control BitmapChecker(in tna_headers_t hdr,
                      inout metadata_t meta,
                      in port_t ingress_port,
                      in bit<16> parser_err,
                      in bit<32> loss_draw,
                      in bit<1> deadline,
                      in bit<1> job_found,
                      in bit<1> in_range,
                      out worker_bitmap_t bitmap_before,
                      out bit<1> aggregate,
                      out bit<1> harvest,
                      out bit<1> release,
                      out bit<1> quorum,
                      out bit<1> deadline_counted,
                      out bit<3> deadline_outcome) {
    Register<bitmap_round_t, cell_t>(NUM_CELLS) bitmaps;

    RegisterAction<bitmap_round_t, cell_t, worker_bitmap_t>(bitmaps) mark = {
        void apply(inout bitmap_round_t set, out worker_bitmap_t before) {
            before = 0;
            if (set.id - hdr.agg.pkt_id < STALE_ROUNDS) {
                before = set.bitmap;          // the round's, or a stale packet's (unused)
            }
            if (set.id == hdr.agg.pkt_id) {
                set.bitmap = set.bitmap | meta.worker_bit;
            } else if (set.id - hdr.agg.pkt_id >= STALE_ROUNDS) {
                set.id = hdr.agg.pkt_id;      // a newer round: the set starts over
                set.bitmap = meta.worker_bit;
            }
        }
    };

    // A RELEASE marks nobody: who is in the round, for the fingerprint register.
    RegisterAction<bitmap_round_t, cell_t, worker_bitmap_t>(bitmaps) peek = {
        void apply(inout bitmap_round_t set, out worker_bitmap_t before) {
            before = set.bitmap;
        }
    };

    action mark_contribution() {
        deadline_counted = 0;
        aggregate = 1;
        harvest = 0;
        release = 0;
        quorum = 0;
        bitmap_before = mark.execute(meta.cell);
    }

    action mark_quorum() {
        deadline_counted = 0;
        aggregate = 1;
        harvest = 0;
        release = 0;
        quorum = 1;
        bitmap_before = mark.execute(meta.cell);
    }

    action check_release() {
        deadline_counted = 0;
        aggregate = 1;
        harvest = 0;
        release = 1;
        quorum = 0;
        bitmap_before = peek.execute(meta.cell);
    }

    // A failed check: counted under its outcome, then dropped.
    action refuse(IngressOutcome outcome) {
        deadline_counted = 0;
        aggregate = 0;
        harvest = 0;
        release = 0;
        quorum = 0;
        meta.outcome = outcome;
        meta.next_step = NextStep.DROP;
    }

    // A RELEASE or QUORUM for a job without a deadline.
    action refuse_request() {
        deadline_counted = 1;
        deadline_outcome = (bit<3>)DEADLINE_RELEASE_REFUSED;
        aggregate = 0;
        harvest = 0;
        release = 0;
        quorum = 0;
        meta.outcome = IngressOutcome.MALFORMED;
        meta.next_step = NextStep.DROP;
    }

    // Pass 2 of a result, back from the recirculation port: decided and counted in
    // pass 1; the sums' low words are read.
    action pass_two() {
        deadline_counted = 0;
        aggregate = 0;
        harvest = 1;
        release = 0;
        quorum = 0;
    }

    table check_and_mark {
        key = { ADMISSION_KEY }
        actions = { mark_contribution; mark_quorum; check_release; refuse; refuse_request;
                    pass_two; }
#define SLOT_IN_POOL 0 &&& ~((slot_t)(POOL_SIZE - 1))
#define CHECKED LOSS_KEPT, 0, AGG_UDP_LENGTH
        const entries = {
            // port, then v1model's checks in order   (first entry that matches wins)
            (AGG_RECIRC_PORT, _, _, _, _, _, _, _, _, _): pass_two();
            (_, CHECKED, MsgType.CONTRIBUTION, _, 1, SLOT_IN_POOL, 1, true): mark_contribution();
            (_, CHECKED, (MsgType)MSG_QUORUM, 1, 1, SLOT_IN_POOL, 1, true): mark_quorum();
            (_, CHECKED, (MsgType)MSG_RELEASE, 1, 1, SLOT_IN_POOL, 1, true): check_release();
            (_, CHECKED, MsgType.CONTRIBUTION, _, 1, SLOT_IN_POOL, 1, _): refuse(IngressOutcome.UNKNOWN_SENDER);
            (_, CHECKED, (MsgType)MSG_QUORUM, _, 1, SLOT_IN_POOL, 1, false): refuse(IngressOutcome.UNKNOWN_SENDER);
            (_, CHECKED, (MsgType)MSG_RELEASE, _, 1, SLOT_IN_POOL, 1, false): refuse(IngressOutcome.UNKNOWN_SENDER);
            (_, CHECKED, (MsgType)MSG_QUORUM, 0, 1, SLOT_IN_POOL, 1, _): refuse_request();
            (_, CHECKED, (MsgType)MSG_RELEASE, 0, 1, SLOT_IN_POOL, 1, _): refuse_request();
            (_, CHECKED, MsgType.CONTRIBUTION, _, 1, _, _, _): refuse(IngressOutcome.BAD_SLOT);
            (_, CHECKED, (MsgType)MSG_QUORUM, _, 1, _, _, _): refuse(IngressOutcome.BAD_SLOT);
            (_, CHECKED, (MsgType)MSG_RELEASE, _, 1, _, _, _): refuse(IngressOutcome.BAD_SLOT);
            (_, CHECKED, MsgType.CONTRIBUTION, _, _, _, _, _): refuse(IngressOutcome.UNKNOWN_JOB);
            (_, CHECKED, (MsgType)MSG_QUORUM, _, _, _, _, _): refuse(IngressOutcome.UNKNOWN_JOB);
            (_, CHECKED, (MsgType)MSG_RELEASE, _, _, _, _, _): refuse(IngressOutcome.UNKNOWN_JOB);
            (_, LOSS_KEPT, _, _, _, _, _, _, _, _): refuse(IngressOutcome.MALFORMED);
        }
#undef CHECKED
#undef SLOT_IN_POOL
        const default_action = refuse(IngressOutcome.SIMULATED_DROP);
        size = 18;
    }

    apply {
        check_and_mark.apply();
    }
}

#endif  // _TNA_BITMAP_CHECKER_P4_
