/*
 * Contributions per (slot, set). The first contribution writes 1 instead of
 * adding, so no reset is ever needed; a retransmission only reads, which tells
 * whether the slot it retransmits for is finished.
 *
 * TNA form of v1model/control/contribution_counter.p4: one Register, three
 * RegisterActions (one stateful ALU). The table matches BitmapChecker's output
 * (see there) and sets v1model's meta.seen / meta.first from the entry it hits, so
 * NextStepSelector keys on the same fields as on v1model. A deadline job's RELEASE and
 * a packet of a released round only read (RoundTracker says which), a stale packet
 * touches nothing; there is no QUORUM_FLAG (round_tracker.p4 says why).
 */
#ifndef _TNA_CONTRIBUTION_COUNTER_P4_
#define _TNA_CONTRIBUTION_COUNTER_P4_

control ContributionCounter(inout metadata_t meta,
                            in worker_bitmap_t bitmap_before,
                            in bit<1> aggregate,
                            in bit<1> release,
                            in bit<32> released,
                            in bit<32> age) {
    Register<count_t, cell_t>(NUM_CELLS) counts;

    RegisterAction<count_t, cell_t, count_t>(counts) write_one = {
        void apply(inout count_t stored, out count_t count) {
            stored = 1;
            count = stored;
        }
    };

    RegisterAction<count_t, cell_t, count_t>(counts) increment = {
        void apply(inout count_t stored, out count_t count) {
            stored = stored + 1;
            count = stored;
        }
    };

    RegisterAction<count_t, cell_t, count_t>(counts) read_count = {
        void apply(inout count_t stored, out count_t count) {
            count = stored;
        }
    };

    action count_first() {       // first contribution to this (slot, set)
        meta.seen = 0;
        meta.first = 1;
        meta.count = write_one.execute(meta.cell);
    }

    action count_next() {        // a further worker's contribution
        meta.seen = 0;
        meta.first = 0;
        meta.count = increment.execute(meta.cell);
    }

    action count_read() {        // retransmission: no change
        meta.seen = 1;
        meta.first = 0;
        meta.count = read_count.execute(meta.cell);
    }

    // A RELEASE, or a packet of a released round from a worker not in its set before
    // (NextStepSelector counts that one late): a released round's count is final.
    action count_final() {
        meta.seen = 0;
        meta.first = 0;
        meta.count = read_count.execute(meta.cell);
    }

    table count_op {
        key = {
            aggregate:      ternary @name("aggregate");
            meta.worker_id: ternary @name("worker_id");
            bitmap_before:  ternary @name("bitmap_before");
            release:        ternary @name("release");
            released[0:0]:  ternary @name("released");
            age[3:0]:       ternary @name("age");
        }
        actions = { count_first; count_next; count_read; count_final; NoAction; }
        const entries = {
            // aggregate worker_id bitmap_before release released age
            //                                             (first entry that matches wins)
            (0, _, _, _, _, _): NoAction();           // not a checked contribution
            (1, _, _, _, _, AGE_STALE): NoAction();   // stale: dropped, uncounted
            (1, _, _, 1, _, _): count_final();        // a RELEASE
#define SEEN(w) (1, w, SEEN_BIT(w), _, 1, _): count_read();
            FOR_EACH_WORKER(SEEN)                     // a released round, seen 1
#undef SEEN
            (1, _, _, _, 1, _): count_final();        // a released round, seen 0
            (1, _, 0, _, _, _): count_first();        // seen 0, first 1
#define SEEN(w) (1, w, SEEN_BIT(w), _, _, _): count_read();
            FOR_EACH_WORKER(SEEN)                     // seen 1
#undef SEEN
            (1, _, _, _, _, _): count_next();         // seen 0, first 0
        }
        const default_action = NoAction();   // never taken: the entries cover all
        size = 72;
    }

    apply {
        count_op.apply();
        if (meta.count == meta.num_workers) {
            meta.done = 1;
        } else {
            meta.done = 0;
        }
    }
}

#endif  // _TNA_CONTRIBUTION_COUNTER_P4_
