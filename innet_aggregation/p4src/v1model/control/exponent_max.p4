/*
 * The largest block exponent any worker sent for a (slot, set): workers use it to
 * agree on one scale per block (block floating point).
 */
#ifndef _EXPONENT_MAX_P4_
#define _EXPONENT_MAX_P4_

control ExponentMax(inout headers_t hdr, in metadata_t meta) {
    register<bit<8>>(NUM_CELLS) exponents;   // exponent_t bits; v1model registers are unsigned

    action write_exponent() {
        exponents.write((bit<32>)meta.cell, (bit<8>)hdr.agg.exponent);
    }

    action max_exponent() {
        bit<8> stored;
        exponents.read(stored, (bit<32>)meta.cell);
        exponent_t larger = ((exponent_t)stored > hdr.agg.exponent) ? (exponent_t)stored
                                                                   : hdr.agg.exponent;
        exponents.write((bit<32>)meta.cell, (bit<8>)larger);
        hdr.agg.exponent = larger;
    }

    action read_exponent() {
        bit<8> stored;
        exponents.read(stored, (bit<32>)meta.cell);
        hdr.agg.exponent = (exponent_t)stored;
    }

    table register_op {
        key = { meta.register_op: exact @name("op"); }
        actions = { write_exponent; max_exponent; read_exponent; NoAction; }
        const entries = {
            RegisterOp.WRITE: write_exponent();
            RegisterOp.ADD:   max_exponent();
            RegisterOp.READ:  read_exponent();
        }
        const default_action = NoAction();
    }

    apply {
        register_op.apply();
    }
}

#endif  // _EXPONENT_MAX_P4_
