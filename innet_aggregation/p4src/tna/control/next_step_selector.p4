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
 */
#ifndef _TNA_NEXT_STEP_SELECTOR_P4_
#define _TNA_NEXT_STEP_SELECTOR_P4_

control NextStepSelector(inout metadata_t meta, in bit<1> aggregate, in count_t asks) {
    // A contribution that is not the last: store it, then drop the packet.
    action consume(RegisterOp op) {
        meta.register_op = op;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.CONSUMED;
    }

    // The last contribution: the packet leaves carrying the result, to every worker.
    action complete(RegisterOp op) {
        meta.register_op = op;
        meta.next_step = NextStep.MULTICAST;
        meta.outcome = IngressOutcome.COMPLETED;
    }

    // Retransmission for a finished slot: its result was lost on the way back.
    action resend() {
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.UNICAST;
        meta.outcome = IngressOutcome.RESENT;
    }

    // Retransmission for an unfinished slot that asks (contributions not 0): a
    // WAITING reply to the sender says who has contributed (`send` builds it).
    action reply_waiting() {
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.WAITING;
        meta.outcome = IngressOutcome.WAITING_SENT;
    }

    // Retransmission for an unfinished slot: already counted, nothing to send yet.
    action drop_duplicate() {
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.DUPLICATE_DROPPED;
    }

    table next_step {
        key = {
            aggregate:  ternary @name("aggregate");
            meta.seen:  ternary @name("seen");
            meta.first: ternary @name("first");
            meta.done:  ternary @name("done");
            asks:       ternary @name("asks");
        }
        actions = { consume; complete; resend; reply_waiting; drop_duplicate; NoAction; }
        const entries = {
            // aggregate seen first done asks     (first entry that matches wins)
            (0,   _,   _,   _,   _  ): NoAction();   // refused, or pass 2: decided already
            (1,   0,   1,   0,   _  ): consume(RegisterOp.WRITE);
            (1,   0,   0,   0,   _  ): consume(RegisterOp.ADD);
            (1,   0,   1,   1,   _  ): complete(RegisterOp.WRITE);   // single-worker job
            (1,   0,   0,   1,   _  ): complete(RegisterOp.ADD);
            (1,   1,   _,   1,   _  ): resend();
            (1,   1,   _,   0,   0  ): drop_duplicate();
            (1,   1,   _,   0,   _  ): reply_waiting();
        }
        const default_action = NoAction();   // never taken: the entries cover all
        size = 8;
    }

    apply {
        next_step.apply();
    }
}

#endif  // _TNA_NEXT_STEP_SELECTOR_P4_
