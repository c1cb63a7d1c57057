/*
 * Per slot, which workers have contributed to each shadow set.
 *
 * One register word per slot holds both sets' bitmaps (a 2 x 32-bit pair, one
 * stateful ALU in dual mode), so one read-modify-write marks the sender in its set
 * and clears it in the other: contributing to set s re-arms set 1-s, and workers
 * reuse slots forever without any reset (SwitchML).
 *
 * TNA form of v1model/control/bitmap_checker.p4. A stateful ALU returns one word,
 * so the action for set s returns set s's bitmap as it was before (bitmap_before).
 * v1model's seen (the sender's bit set in it) and first (bitmap_before == 0) are
 * not computed here: the tables that need them (ContributionCounter, ValuePair,
 * ExponentMax) match (worker_id, bitmap_before) directly, one entry per worker
 * (FOR_EACH_WORKER), in the stage right after this one; computing seen would cost
 * a stage. ContributionCounter writes meta.seen / meta.first.
 *
 * The same table also admits the packet: its key holds every check v1model makes
 * with if/else before its bitmap (loss draw, parser error, length, message type,
 * job, slot range, sender), and its entries, first match wins, take them in
 * v1model's order, so a packet failing several is counted under the same outcome.
 * The 34 stateful ALUs after the bitmap need nine of the twelve stages, so the
 * bitmap must sit in stage 2, right after the lookups (0) and the loss draw (1):
 * a gateway chain, or a separate admission table, would cost a stage before it.
 * Every action writes `aggregate` and `harvest`, which the register tables after it
 * key on.
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
                      in bit<1> job_found,
                      in bit<1> in_range,
                      out worker_bitmap_t bitmap_before,
                      out bit<1> aggregate,
                      out bit<1> harvest) {
    Register<worker_bitmap_pair_t, slot_t>(POOL_SIZE) bitmaps;

    RegisterAction<worker_bitmap_pair_t, slot_t, worker_bitmap_t>(bitmaps) mark_set0 = {
        void apply(inout worker_bitmap_pair_t pair, out worker_bitmap_t before) {
            before = pair.set0;
            pair.set0 = pair.set0 | meta.worker_bit;
            pair.set1 = pair.set1 & ~meta.worker_bit;
        }
    };

    RegisterAction<worker_bitmap_pair_t, slot_t, worker_bitmap_t>(bitmaps) mark_set1 = {
        void apply(inout worker_bitmap_pair_t pair, out worker_bitmap_t before) {
            before = pair.set1;
            pair.set0 = pair.set0 & ~meta.worker_bit;
            pair.set1 = pair.set1 | meta.worker_bit;
        }
    };

    action check_and_mark_set0() {
        aggregate = 1;
        harvest = 0;
        bitmap_before = mark_set0.execute(hdr.agg.slot);
    }

    action check_and_mark_set1() {
        aggregate = 1;
        harvest = 0;
        bitmap_before = mark_set1.execute(hdr.agg.slot);
    }

    // A failed check: counted under its outcome, then dropped.
    action refuse(IngressOutcome outcome) {
        aggregate = 0;
        harvest = 0;
        meta.outcome = outcome;
        meta.next_step = NextStep.DROP;
    }

    // Pass 2 of a result, back from the recirculation port: decided and counted in
    // pass 1; the sums' low words are read.
    action pass_two() {
        aggregate = 0;
        harvest = 1;
    }

    table check_and_mark {
        key = {
            ingress_port:      ternary @name("ingress_port");
            loss_draw:         ternary @name("loss_draw");
            parser_err:        ternary @name("parser_err");
            hdr.udp.length:    ternary @name("udp_length");
            hdr.agg.msg_type:  ternary @name("msg_type");
            job_found:         ternary @name("job_found");
            hdr.agg.slot:      ternary @name("slot");
            in_range:          ternary @name("in_range");
            meta.known_sender: ternary @name("known_sender");
            hdr.agg.set:       ternary @name("set");
        }
        actions = { check_and_mark_set0; check_and_mark_set1; refuse; pass_two; }
#define SLOT_IN_POOL 0 &&& ~((slot_t)(POOL_SIZE - 1))
#define WELL_FORMED LOSS_KEPT, 0, AGG_UDP_LENGTH, MsgType.CONTRIBUTION
        const entries = {
            // port, then v1model's checks in order   (first entry that matches wins)
            (AGG_RECIRC_PORT, _, _, _, _, _, _, _, _, _): pass_two();
            (_, WELL_FORMED, 1, SLOT_IN_POOL, 1, true, 0): check_and_mark_set0();
            (_, WELL_FORMED, 1, SLOT_IN_POOL, 1, true, 1): check_and_mark_set1();
            (_, WELL_FORMED, 1, SLOT_IN_POOL, 1, _, _): refuse(IngressOutcome.UNKNOWN_SENDER);
            (_, WELL_FORMED, 1, _, _, _, _): refuse(IngressOutcome.BAD_SLOT);
            (_, WELL_FORMED, _, _, _, _, _): refuse(IngressOutcome.UNKNOWN_JOB);
            (_, LOSS_KEPT, _, _, _, _, _, _, _, _): refuse(IngressOutcome.MALFORMED);
        }
#undef WELL_FORMED
#undef SLOT_IN_POOL
        const default_action = refuse(IngressOutcome.SIMULATED_DROP);
        size = 8;
    }

    apply {
        check_and_mark.apply();
    }
}

#endif  // _TNA_BITMAP_CHECKER_P4_
