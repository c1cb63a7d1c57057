/*
 * Per (slot, set) of a deadline job: whether its round was released
 * (shared/deadline.p4), and for every job how old a packet's round is.
 *
 * TNA form of v1model/control/round_tracker.p4. A stateful ALU returns one word and
 * tests two conditions, so the round's state is kept three times, each copy written
 * alike by the same packets and read for one answer:
 *  - `ages` (every job): the round's packet id; answers same / stale / newer as the
 *    stateful ALU's predicate (AGE_*). A newer id starts the round.
 *  - `rounds` (deadline jobs): {packet id, released}; answers whether the packet's
 *    round was released, and a RELEASE of the round sets the flag.
 *  - BitmapChecker's bitmaps: {bitmap, packet id}; a newer id starts the set over.
 * All three sit in stage 2 beside the bitmap, behind the same admission (the loss draw
 * of stage 1 included: a packet the simulator drops touches none of them), so their
 * tables repeat BitmapChecker's checks rather than wait a stage for its verdict.
 *
 * A QUORUM is counted as a plain contribution here. Releasing a round at its quorum
 * needs the count (ContributionCounter, stage 3, after the bitmap that says whether a
 * packet is a worker's first) before any value register, so that a contribution
 * arriving after the release is not added to the released sums; the 35 registers after
 * the bitmap (count, exponent, fingerprint sum, 32 value pairs) fill stages 3 to 11 but
 * for one ALU, so no stage is left for it. A deadline job on Tofino
 * therefore has every round released by a worker's RELEASE at the deadline.
 */
#ifndef _TNA_ROUND_TRACKER_P4_
#define _TNA_ROUND_TRACKER_P4_

// The `ages` answer: RegisterAction.predicate()'s one-hot code of its two conditions
// (cmplo: the round's id; cmphi: at most STALE_ROUNDS - 1 rounds behind it), bit
// cmplo + 2 cmphi (bf-p4c's stateful_alu.cpp, cmp_mask).
const bit<4> AGE_NEWER = 0x1;   // neither: a newer round (or a packet the tables refused)
const bit<4> AGE_STALE = 0x4;   // behind the round, not it
const bit<4> AGE_SAME = 0x8;    // the round's id

control RoundTracker(in tna_headers_t hdr,
                     in metadata_t meta,
                     in port_t ingress_port,
                     in bit<16> parser_err,
                     in bit<32> loss_draw,
                     in bit<1> job_found,
                     in bit<1> in_range,
                     out bit<1> deadline,
                     out bit<32> age,
                     out bit<32> released) {
    Register<round_state_t, cell_t>(NUM_CELLS) rounds;
    Register<pkt_id_t, cell_t>(NUM_CELLS) ages;

    action set_deadline() {
        deadline = 1;
    }

    // A default action rather than an initial value: see DropSimulator.no_loss.
    action no_deadline() {
        deadline = 0;
    }

    table deadline_jobs {
        key = { hdr.agg.job_id: exact @name("job_id"); }
        actions = { set_deadline; @defaultonly no_deadline; }
        const default_action = no_deadline();
        size = MAX_JOBS;
    }

    RegisterAction<pkt_id_t, cell_t, bit<32>>(ages) age_step = {
        void apply(inout pkt_id_t id, out bit<32> code) {
            bool same = id == hdr.agg.pkt_id;
            bool near = id - hdr.agg.pkt_id < STALE_ROUNDS;
            code = this.predicate(same, near);
            if (!near) {
                id = hdr.agg.pkt_id;
            }
        }
    };

    // A RELEASE never starts a round: nobody has contributed to a newer one.
    RegisterAction<pkt_id_t, cell_t, bit<32>>(ages) age_peek = {
        void apply(inout pkt_id_t id, out bit<32> code) {
            code = this.predicate(id == hdr.agg.pkt_id, id - hdr.agg.pkt_id < STALE_ROUNDS);
        }
    };

    RegisterAction<round_state_t, cell_t, bit<32>>(rounds) track = {
        void apply(inout round_state_t r, out bit<32> was_released) {
            was_released = 0;
            if (r.id == hdr.agg.pkt_id) {
                was_released = r.released;
            } else if (r.id - hdr.agg.pkt_id >= STALE_ROUNDS) {
                r.id = hdr.agg.pkt_id;
                r.released = 0;
            }
        }
    };

    // The round's flag, set for the workers still to come (of a finished round too:
    // NextStepSelector answers those with the full result).
    RegisterAction<round_state_t, cell_t, bit<32>>(rounds) track_release = {
        void apply(inout round_state_t r, out bit<32> was_released) {
            was_released = 0;
            if (r.id == hdr.agg.pkt_id) {
                was_released = r.released;
                r.released = 1;
            }
        }
    };

    action step_age() {
        age = age_step.execute(meta.cell);
    }

    action peek_age() {
        age = age_peek.execute(meta.cell);
    }

    action untracked_age() {
        age = 0;
    }

    action step_round() {
        released = track.execute(meta.cell);
    }

    action release_round() {
        released = track_release.execute(meta.cell);
    }

    action untracked_round() {
        released = 0;
    }

    // BitmapChecker's admission (ADMISSION_KEY, header.p4); a RELEASE or QUORUM only for
    // a deadline job.
#define ADMITTED(type, on) LOSS_KEPT, 0, AGG_UDP_LENGTH, type, on, 1, 0 &&& ~((slot_t)(POOL_SIZE - 1)), 1, true

    table age_op {
        key = { ADMISSION_KEY }
        actions = { step_age; peek_age; untracked_age; }
        const entries = {
            (AGG_RECIRC_PORT, _, _, _, _, _, _, _, _, _): untracked_age();
            (_, ADMITTED(MsgType.CONTRIBUTION, _)): step_age();
            (_, ADMITTED((MsgType)MSG_QUORUM, 1)): step_age();
            (_, ADMITTED((MsgType)MSG_RELEASE, 1)): peek_age();
        }
        const default_action = untracked_age();
        size = 4;
    }

    table round_op {
        key = { ADMISSION_KEY }
        actions = { step_round; release_round; untracked_round; }
        const entries = {
            (AGG_RECIRC_PORT, _, _, _, _, _, _, _, _, _): untracked_round();
            (_, ADMITTED(MsgType.CONTRIBUTION, 1)): step_round();
            (_, ADMITTED((MsgType)MSG_QUORUM, 1)): step_round();
            (_, ADMITTED((MsgType)MSG_RELEASE, 1)): release_round();
        }
        const default_action = untracked_round();
        size = 4;
    }
#undef ADMITTED

    apply {
        deadline_jobs.apply();
        age_op.apply();
        round_op.apply();
    }
}

#endif  // _TNA_ROUND_TRACKER_P4_
