/*
 * Contributions per (slot, set). The first contribution writes 1 instead of
 * adding, so no reset is ever needed; a retransmission only reads, which tells
 * whether the slot it retransmits for is finished.
 *
 * On a leaf the same word records whether the parent's result is stored: its
 * arrival sets FINAL_FLAG, but only on a complete local sum (a result for a round
 * the leaf has not finished is stale). The next round's first contribution
 * writes 1 and so clears it. One read-modify-write per packet in every case.
 * In a deadline job, a release, a packet for a released round and a stale one
 * only read (deadline.p4): a released round's count is final. A QUORUM contribution
 * that brings the count to its quorum (short of every worker) releases the round: the
 * same write sets QUORUM_FLAG, after which the count stays and every later packet of
 * the round is one for a released round.
 */
#ifndef _CONTRIBUTION_COUNTER_P4_
#define _CONTRIBUTION_COUNTER_P4_

control ContributionCounter(in headers_t hdr, inout metadata_t meta, inout deadline_t d) {
    register<count_t>(NUM_CELLS) counts;

    action count_first() {
        d.reached = (d.quorum == 1 && hdr.agg.contributions == 1 && meta.num_workers > 1)
                    ? 1w1 : 1w0;
        counts.write((bit<32>)meta.cell, (d.reached == 1) ? (1 | QUORUM_FLAG) : 1);
        meta.count = 1;
    }

    action count_next() {
        count_t count;
        counts.read(count, (bit<32>)meta.cell);
        // A deadline job's round released at its quorum counts nobody more.
        bool closed = d.on == 1 && (count & QUORUM_FLAG) != 0;
        count_t next = closed ? count : count + 1;
        d.reached = (!closed && d.quorum == 1 && next >= hdr.agg.contributions
                     && next < meta.num_workers) ? 1w1 : 1w0;
        counts.write((bit<32>)meta.cell, (d.reached == 1) ? (next | QUORUM_FLAG) : next);
        meta.count = next;
    }

    action count_read() {
        counts.read(meta.count, (bit<32>)meta.cell);
    }

    action count_finalize() {
        count_t count;
        counts.read(count, (bit<32>)meta.cell);
        counts.write((bit<32>)meta.cell,
                     (count == meta.num_workers) ? (count | FINAL_FLAG) : count);
        meta.count = count;
    }

    table count_op {
        key = {
            d.release:        ternary @name("release");
            d.released:       ternary @name("released");
            d.stale:          ternary @name("stale");
            meta.from_parent: ternary @name("from_parent");
            meta.seen:        ternary @name("seen");
            meta.first:       ternary @name("first");
        }
        actions = { count_first; count_next; count_read; count_finalize; }
        const entries = {
            // release released stale parent seen first
            (  1,      _,       _,    _,     _,   _  ): count_read();      // a release
            (  _,      1,       _,    _,     _,   _  ): count_read();      // a released round
            (  _,      _,       1,    _,     _,   _  ): count_read();      // stale
            (  _,      _,       _,    0,     0,   1  ): count_first();     // first contribution to this (slot, set)
            (  _,      _,       _,    0,     0,   0  ): count_next();      // a further worker's contribution
            (  _,      _,       _,    0,     1,   _  ): count_read();      // retransmission: no change
            (  _,      _,       _,    1,     _,   _  ): count_finalize();  // the parent's result
        }
        const default_action = count_read();
    }

    apply {
        count_op.apply();
        if (d.on == 1 && (meta.count & QUORUM_FLAG) != 0) {
            d.released = 1;
            meta.count = meta.count & ~QUORUM_FLAG;
        }
        meta.final = ((meta.count & FINAL_FLAG) != 0) ? 1w1 : 1w0;
        meta.count = meta.count & ~FINAL_FLAG;
        meta.done = (meta.count == meta.num_workers) ? 1w1 : 1w0;
    }
}

#endif  // _CONTRIBUTION_COUNTER_P4_
