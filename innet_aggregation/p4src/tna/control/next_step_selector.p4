/*
 * The fixed decision of the program, as a truth table: what the registers do, and
 * where the packet goes. v1model/control/next_step_selector.p4's table, plus the
 * key `aggregate` (a checked contribution), so that it runs for every aggregation
 * packet instead of inside an if: on Tofino 1, a table after an if block waits for
 * every table in it (see aggregation.p4); and the key `asks` (the packet's
 * contributions field, not 0 in a worker's retransmission that asks for a WAITING
 * reply), matched as it is, without a stage to turn it into a flag.
 *
 * On Tofino meta.register_op only documents the decision (and is visible in the
 * compiler's PHV/table logs): the register tables cannot wait for `done`, so they
 * match BitmapChecker's outputs, which give the same WRITE/ADD; where this table
 * says NONE (retransmission, slot not done) they READ, and the packet is dropped.
 *
 * A deadline job's rows (shared/deadline.p4) are v1model's, keyed on RoundTracker's
 * answers (`age`, `released`) and BitmapChecker's `release` and `quorum`. The actions
 * that send a released round set `as_released` (the packet leaves as RELEASED) and
 * `record` (FingerprintSum keeps who is in it), and those that count a deadline
 * outcome set `deadline_counted` and its cell.
 */
#ifndef _TNA_NEXT_STEP_SELECTOR_P4_
#define _TNA_NEXT_STEP_SELECTOR_P4_

control NextStepSelector(inout metadata_t meta,
                         in bit<1> aggregate,
                         in count_t asks,
                         in bit<1> deadline,
                         in bit<1> release,
                         in bit<1> quorum,
                         in bit<32> released,
                         in bit<32> age,
                            inout bit<1> deadline_counted,
                         inout bit<3> deadline_outcome,
                         out bit<1> as_released,
                         out bit<1> record) {
    // A contribution that is not the last: store it, then drop the packet.
    action consume(RegisterOp op) {
        as_released = 0;
        record = 0;
        meta.register_op = op;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.CONSUMED;
    }

    // The last contribution: the packet leaves carrying the result, to every worker.
    action complete(RegisterOp op) {
        as_released = 0;
        record = 0;
        meta.register_op = op;
        meta.next_step = NextStep.MULTICAST;
        meta.outcome = IngressOutcome.COMPLETED;
    }

    // Retransmission for a finished slot: its result was lost on the way back.
    action resend() {
        as_released = 0;
        record = 0;
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.UNICAST;
        meta.outcome = IngressOutcome.RESENT;
    }

    // Retransmission for an unfinished slot that asks (contributions not 0): a
    // WAITING reply to the sender says who has contributed (`send` builds it).
    action reply_waiting() {
        as_released = 0;
        record = 0;
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.WAITING;
        meta.outcome = IngressOutcome.WAITING_SENT;
    }

    // Retransmission for an unfinished slot: already counted, nothing to send yet.
    action drop_duplicate() {
        as_released = 0;
        record = 0;
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.DUPLICATE_DROPPED;
    }

    // A release of an open round: what it holds leaves for every worker, and the
    // fingerprint register keeps who is in it, for the workers that come later.
    action release_round() {
        as_released = 1;
        record = 1;
        deadline_counted = 1;
        deadline_outcome = (bit<3>)DEADLINE_RELEASED;
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.MULTICAST;
        meta.outcome = IngressOutcome.COMPLETED;
    }

    // A packet for a released round, or a release again: the released sum, to the
    // sender.
    action resend_released() {
        as_released = 1;
        record = 0;
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.UNICAST;
        meta.outcome = IngressOutcome.RESENT;
    }

    // The same, for a contribution from a worker not in the round: counted late.
    action resend_late() {
        as_released = 1;
        record = 0;
        deadline_counted = 1;
        deadline_outcome = (bit<3>)DEADLINE_LATE;
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.UNICAST;
        meta.outcome = IngressOutcome.RESENT;
    }

    // A packet of an older round than its (slot, set)'s: its round is gone. Counted
    // for a deadline job (`counted`), whose late workers send them; in another job it is
    // a stray duplicate.
    action drop_stale(bit<1> counted) {
        as_released = 0;
        record = 0;
        deadline_counted = counted;
        deadline_outcome = (bit<3>)DEADLINE_STALE;
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.DUPLICATE_DROPPED;
    }

    // A release for a round nobody has contributed to: nothing to release.
    action refuse_release() {
        as_released = 0;
        record = 0;
        deadline_counted = 1;
        deadline_outcome = (bit<3>)DEADLINE_RELEASE_REFUSED;
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.MALFORMED;
    }

    // Refused at the checks, or pass 2: decided already.
    action decided() {
        as_released = 0;
        record = 0;
    }

    table next_step {
        key = {
            aggregate:     ternary @name("aggregate");
            deadline:      ternary @name("deadline");
            age[3:0]:      ternary @name("age");
            release:       ternary @name("release");
            released[0:0]: ternary @name("released");
            meta.seen:     ternary @name("seen");
            meta.first:    ternary @name("first");
            meta.done:     ternary @name("done");
            quorum:        ternary @name("quorum");
            asks:          ternary @name("asks");
        }
        actions = { consume; complete; resend; reply_waiting; drop_duplicate; release_round;
                    resend_released; resend_late; drop_stale; refuse_release; decided; }
        const entries = {
            // aggregate deadline age release released seen first done quorum asks
            //                                             (first entry that matches wins)
            (0, _, _,         _, _, _, _, _, _, _): decided();   // refused, or pass 2
            (1, 1, AGE_STALE, _, _, _, _, _, _, _): drop_stale(1);
            (1, _, AGE_STALE, _, _, _, _, _, _, _): drop_stale(0);
            (1, _, AGE_NEWER, 1, _, _, _, _, _, _): refuse_release();
            (1, _, _,         1, _, _, _, 1, _, _): resend();    // finished: the whole sum
            (1, _, _,         _, 1, _, _, 1, _, _): resend();
            (1, _, _,         1, 1, _, _, _, _, _): resend_released();
            (1, _, _,         0, 1, 0, _, _, _, _): resend_late();
            (1, _, _,         0, 1, 1, _, _, _, _): resend_released();
            (1, _, _,         1, 0, _, _, _, _, _): release_round();
            (1, _, _,         _, _, 0, 1, 0, _, _): consume(RegisterOp.WRITE);
            (1, _, _,         _, _, 0, 0, 0, _, _): consume(RegisterOp.ADD);
            (1, _, _,         _, _, 0, 1, 1, _, _): complete(RegisterOp.WRITE);   // single-worker job
            (1, _, _,         _, _, 0, 0, 1, _, _): complete(RegisterOp.ADD);
            (1, _, _,         _, _, 1, _, 1, _, _): resend();
            (1, _, _,         _, _, 1, _, 0, 1, _): drop_duplicate();   // a QUORUM's field is its quorum
            (1, _, _,         _, _, 1, _, 0, _, 0): drop_duplicate();
            (1, _, _,         _, _, 1, _, 0, _, _): reply_waiting();
        }
        const default_action = decided();   // never taken: the entries cover all
        size = 18;
    }

    apply {
        next_step.apply();
    }
}

#endif  // _TNA_NEXT_STEP_SELECTOR_P4_
