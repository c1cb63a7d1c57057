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

control NextStepSelector(inout metadata_t meta, inout deadline_t d) {
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

    // A release of an open round: what it holds leaves for every worker, and the
    // fingerprint register keeps who is in it, for the workers that come later.
    action release_round() {
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.MULTICAST;
        meta.outcome = IngressOutcome.COMPLETED;
        d.as_released = 1;
        d.record = 1;
    }

    // A QUORUM contribution that completes its quorum: stored (``op``), and what the
    // round holds leaves for every worker as a release does.
    action release_at_quorum(RegisterOp op) {
        meta.register_op = op;
        meta.next_step = NextStep.MULTICAST;
        meta.outcome = IngressOutcome.COMPLETED;
        d.as_released = 1;
        d.record = 1;
    }

    // A packet for a released round, or a release again: the released sum, to the sender.
    action resend_released() {
        meta.register_op = RegisterOp.READ;
        meta.next_step = NextStep.UNICAST;
        meta.outcome = IngressOutcome.RESENT;
        d.as_released = 1;
    }

    // A packet of an older round than its (slot, set)'s: its round is gone.
    action drop_stale() {
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.DUPLICATE_DROPPED;
    }

    // A release for a round nobody has contributed to: nothing to release.
    action refuse_release() {
        meta.register_op = RegisterOp.NONE;
        meta.next_step = NextStep.DROP;
        meta.outcome = IngressOutcome.MALFORMED;
    }

    table next_step {
        key = {
            d.stale:          ternary @name("stale");
            d.release:        ternary @name("release");
            d.empty:          ternary @name("empty");
            d.released:       ternary @name("released");
            meta.from_parent: ternary @name("from_parent");
            meta.has_parent:  ternary @name("has_parent");
            meta.seen:        ternary @name("seen");
            meta.first:       ternary @name("first");
            meta.done:        ternary @name("done");
            meta.final:       ternary @name("final");
            meta.asks:        ternary @name("asks");
        }
        actions = { consume; complete; resend; reply_waiting; drop_duplicate;
                    send_up; resend_up; accept_result;
                    release_round; resend_released; drop_stale; refuse_release; }
        const entries = {
            // stale release empty released | parent leaf seen first done final asks
            (  1,     _,      _,    _,          _,     _,   _,   _,   _,   _,    _  ): drop_stale();
            (  0,     1,      1,    _,          _,     _,   _,   _,   _,   _,    _  ): refuse_release();
            (  0,     1,      0,    _,          0,     0,   _,   _,   1,   _,    _  ): resend();  // finished: the whole sum
            (  0,     0,      0,    1,          0,     0,   _,   _,   1,   _,    _  ): resend();
            (  0,     _,      0,    1,          0,     0,   _,   _,   0,   _,    _  ): resend_released();
            (  0,     1,      0,    0,          0,     0,   _,   _,   0,   _,    _  ): release_round();
            // parent leaf seen first done final asks
            (  _,     _,      _,    _,          0,     _,   0,   1,   0,   _,    _  ): consume(RegisterOp.WRITE);
            (  _,     _,      _,    _,          0,     _,   0,   0,   0,   _,    _  ): consume(RegisterOp.ADD);
            (  _,     _,      _,    _,          0,     0,   0,   1,   1,   _,    _  ): complete(RegisterOp.WRITE);  // single worker
            (  _,     _,      _,    _,          0,     0,   0,   0,   1,   _,    _  ): complete(RegisterOp.ADD);
            (  _,     _,      _,    _,          0,     1,   0,   1,   1,   _,    _  ): send_up(RegisterOp.WRITE);   // single worker
            (  _,     _,      _,    _,          0,     1,   0,   0,   1,   _,    _  ): send_up(RegisterOp.ADD);
            (  _,     _,      _,    _,          0,     0,   1,   _,   1,   _,    _  ): resend();
            (  _,     _,      _,    _,          0,     1,   1,   _,   1,   1,    _  ): resend();
            (  _,     _,      _,    _,          0,     1,   1,   _,   1,   0,    _  ): resend_up();
            (  _,     _,      _,    _,          0,     _,   1,   _,   0,   _,    1  ): reply_waiting();
            (  _,     _,      _,    _,          0,     _,   1,   _,   0,   _,    0  ): drop_duplicate();
            (  _,     _,      _,    _,          1,     _,   _,   _,   1,   0,    _  ): accept_result();
            (  _,     _,      _,    _,          1,     _,   _,   _,   _,   _,    _  ): drop_duplicate();  // stale, or already stored
        }
        const default_action = drop_duplicate();
    }

    apply {
        if (d.reached == 0) {
            next_step.apply();
        } else if (meta.first == 1) {
            release_at_quorum(RegisterOp.WRITE);
        } else {
            release_at_quorum(RegisterOp.ADD);
        }
    }
}

#endif  // _NEXT_STEP_SELECTOR_P4_
