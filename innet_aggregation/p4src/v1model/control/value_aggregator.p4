/*
 * The sums: one register per value position, indexed by (slot, set).
 *
 * Each action touches every register exactly once (one read-modify-write each), so
 * each register maps onto one Tofino stateful ALU. Sums saturate at the int32
 * limits instead of wrapping, so an overflow is visible rather than wrong by 2^32.
 */
#ifndef _VALUE_AGGREGATOR_P4_
#define _VALUE_AGGREGATOR_P4_

control ValueAggregator(inout headers_t hdr, in metadata_t meta) {
    // Every register's index, set once per packet. Cast inside each access instead,
    // p4c gives every access its own copy of the index: three extra scalars per value
    // that a software target stores and loads on every packet.
    bit<32> cell;

#define VALUE_REGISTER(i) register<value_t>(NUM_CELLS) value_##i;
    FOR_EACH_VALUE(VALUE_REGISTER)
#undef VALUE_REGISTER

    // The first contribution overwrites whatever an earlier round left.
    action write_values() {
#define WRITE_VALUE(i) value_##i.write(cell, hdr.values.v##i);
        FOR_EACH_VALUE(WRITE_VALUE)
#undef WRITE_VALUE
    }

    action add_values() {
        value_t stored;
#define ADD_VALUE(i)                                                             \
        value_##i.read(stored, cell);                              \
        hdr.values.v##i = (value_t)((int<32>)stored |+| (int<32>)hdr.values.v##i); \
        value_##i.write(cell, hdr.values.v##i);
        FOR_EACH_VALUE(ADD_VALUE)
#undef ADD_VALUE
    }

    action read_values() {
#define READ_VALUE(i) value_##i.read(hdr.values.v##i, cell);
        FOR_EACH_VALUE(READ_VALUE)
#undef READ_VALUE
    }

    table register_op {
        key = { meta.register_op: exact @name("op"); }
        actions = { write_values; add_values; read_values; NoAction; }
        const entries = {
            RegisterOp.WRITE: write_values();
            RegisterOp.ADD:   add_values();
            RegisterOp.READ:  read_values();
        }
        const default_action = NoAction();
    }

    apply {
        cell = (bit<32>)meta.cell;
        register_op.apply();
    }
}

#endif  // _VALUE_AGGREGATOR_P4_
