/*
 * The sums: VALUES_PER_PACKET/2 ValuePair controls, each one register pair and one
 * stateful ALU, indexed by (slot, set). 64 values = 32 stateful ALUs, 8 of Tofino
 * 1's 12 stages at 4 per stage.
 *
 * TNA form of v1model/control/value_aggregator.p4 (64 one-word registers there).
 * The register operation comes from BitmapChecker's outputs instead of
 * meta.register_op (see next_step_selector.p4), and from `harvest` on pass 2 of a
 * result (see value_pair.p4).
 */
#ifndef _TNA_VALUE_AGGREGATOR_P4_
#define _TNA_VALUE_AGGREGATOR_P4_

control ValueAggregator(inout tna_headers_t hdr,
                        in metadata_t meta,
                        in worker_bitmap_t bitmap_before,
                        in bit<1> aggregate,
                        in bit<1> harvest,
                        in bit<1> release,
                        in bit<32> released,
                        in bit<32> age) {
#define VALUE_PAIR(p, a, b) ValuePair() pair_##p;
    FOR_EACH_VALUE_PAIR(VALUE_PAIR)
#undef VALUE_PAIR

    apply {
#define APPLY_PAIR(p, a, b) \
        pair_##p.apply(hdr.values.v##a, hdr.values.v##b, meta.cell, meta.worker_id, bitmap_before, aggregate, harvest, \
                     release, released, age);
        FOR_EACH_VALUE_PAIR(APPLY_PAIR)
#undef APPLY_PAIR
    }
}

#endif  // _TNA_VALUE_AGGREGATOR_P4_
