/*
 * Contributions per (slot, set). The first contribution writes 1 instead of
 * adding, so no reset is ever needed; a retransmission only reads, which tells
 * whether the slot it retransmits for is finished.
 */
#ifndef _CONTRIBUTION_COUNTER_P4_
#define _CONTRIBUTION_COUNTER_P4_

control ContributionCounter(inout metadata_t meta) {
    register<count_t>(NUM_CELLS) counts;

    action count_first() {
        counts.write((bit<32>)meta.cell, 1);
        meta.count = 1;
    }

    action count_next() {
        count_t count;
        counts.read(count, (bit<32>)meta.cell);
        count = count + 1;
        counts.write((bit<32>)meta.cell, count);
        meta.count = count;
    }

    action count_read() {
        counts.read(meta.count, (bit<32>)meta.cell);
    }

    table count_op {
        key = {
            meta.seen:  ternary @name("seen");
            meta.first: ternary @name("first");
        }
        actions = { count_first; count_next; count_read; }
        const entries = {
            // seen first
            (  0,   1  ): count_first();   // first contribution to this (slot, set)
            (  0,   0  ): count_next();    // a further worker's contribution
            (  1,   _  ): count_read();    // retransmission: no change
        }
        const default_action = count_read();
    }

    apply {
        count_op.apply();
        meta.done = (meta.count == meta.num_workers) ? 1w1 : 1w0;
    }
}

#endif  // _CONTRIBUTION_COUNTER_P4_
