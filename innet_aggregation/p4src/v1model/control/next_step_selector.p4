/*
 * The fixed decision of the program, as a truth table: what the value and exponent
 * registers do, and where the packet goes.
 *
 * A retransmission for an unfinished slot is dropped, or, if it asks (a worker's
 * timer-driven retransmission), answered with a short WAITING reply naming who has
 * contributed, so a worker kept waiting learns which workers are missing. Only
 * what asks is answered, once per ask, to the sender alone, with the header alone
 * (14 bytes of UDP payload against 270 at 64 values): the workers' timers, which
 * back off to one retransmission per slot every max_rto, bound the replies' rate.
 *
 * A leaf (has_parent) differs in three rows: its complete local sum goes up to the
 * parent instead of back to the workers; a worker's retransmission for a complete
 * sum gets the stored result if the parent's has come (final), and otherwise
 * resends the stored partial sum upstream, so loss anywhere in the tree is repaired
 * by the workers' timers alone; and the parent's result, stored over the partial
 * sum, is multicast to the leaf's workers.
 */
#ifndef _NEXT_STEP_SELECTOR_P4_
#define _NEXT_STEP_SELECTOR_P4_

control NextStepSelector(inout metadata_t meta) {
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

    // Retransmission for an unfinished slot that asks: a short reply to the sender
    // says who has contributed.
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

    // A leaf's local sum is complete: it leaves for the parent as one contribution.
    action send_up(RegisterOp op) {
        meta.register_op = op;
        meta.next_step = NextStep.UPSTREAM;
        meta.outcome = IngressOutcome.SENT_UP;
    }

    // Retransmission at a leaf whose parent result has not come: the partial sum
    // or the parent's result was lost above; the parent's bitmap drops a duplicate.
    action resend_up() {
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.UPSTREAM;
        meta.outcome = IngressOutcome.RESENT_UP;
    }

    // The parent's result: kept for unicast resends, and sent to every local worker.
    action accept_result() {
        meta.register_op = RegisterOp.WRITE;
        meta.next_step = NextStep.MULTICAST;
        meta.outcome = IngressOutcome.PARENT_RESULT;
    }

    table next_step {
        key = {
            meta.from_parent: ternary @name("from_parent");
            meta.has_parent:  ternary @name("has_parent");
            meta.seen:        ternary @name("seen");
            meta.first:       ternary @name("first");
            meta.done:        ternary @name("done");
            meta.final:       ternary @name("final");
            meta.asks:        ternary @name("asks");
        }
        actions = { consume; complete; resend; reply_waiting; drop_duplicate;
                    send_up; resend_up; accept_result; }
        const entries = {
            // parent leaf seen first done final asks
            (  0,     _,   0,   1,   0,   _,    _  ): consume(RegisterOp.WRITE);
            (  0,     _,   0,   0,   0,   _,    _  ): consume(RegisterOp.ADD);
            (  0,     0,   0,   1,   1,   _,    _  ): complete(RegisterOp.WRITE);  // single worker
            (  0,     0,   0,   0,   1,   _,    _  ): complete(RegisterOp.ADD);
            (  0,     1,   0,   1,   1,   _,    _  ): send_up(RegisterOp.WRITE);   // single worker
            (  0,     1,   0,   0,   1,   _,    _  ): send_up(RegisterOp.ADD);
            (  0,     0,   1,   _,   1,   _,    _  ): resend();
            (  0,     1,   1,   _,   1,   1,    _  ): resend();
            (  0,     1,   1,   _,   1,   0,    _  ): resend_up();
            (  0,     _,   1,   _,   0,   _,    1  ): reply_waiting();
            (  0,     _,   1,   _,   0,   _,    0  ): drop_duplicate();
            (  1,     _,   _,   _,   1,   0,    _  ): accept_result();
            (  1,     _,   _,   _,   _,   _,    _  ): drop_duplicate();  // stale, or already stored
        }
        const default_action = drop_duplicate();
    }

    apply {
        next_step.apply();
    }
}

#endif  // _NEXT_STEP_SELECTOR_P4_
