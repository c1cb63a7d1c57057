/*
 * The largest block exponent any worker sent for a (slot, set): workers use it to
 * agree on one scale per block (block floating point).
 *
 * TNA form of v1model/control/exponent_max.p4: a signed 8-bit Register (the
 * stateful ALU's maxs), one RegisterAction per v1model action, keyed like
 * ValueAggregator on BitmapChecker's outputs. On a retransmission it reads
 * (v1model reads only when the slot is done; the packet is dropped otherwise, so
 * the extra read is never seen). Pass 2 of a result does not touch it: pass 1
 * already put the maximum in the packet.
 */
#ifndef _TNA_EXPONENT_MAX_P4_
#define _TNA_EXPONENT_MAX_P4_

control ExponentMax(inout tna_headers_t hdr,
                    in metadata_t meta,
                    in worker_bitmap_t bitmap_before,
                    in bit<1> aggregate,
                    in bit<1> release,
                    in bit<32> released,
                    in bit<32> age) {
    Register<exponent_t, cell_t>(NUM_CELLS) exponents;

    RegisterAction<exponent_t, cell_t, exponent_t>(exponents) store_exponent = {
        void apply(inout exponent_t stored, out exponent_t result) {
            stored = hdr.agg.exponent;
            result = stored;
        }
    };

    RegisterAction<exponent_t, cell_t, exponent_t>(exponents) max_of_exponents = {
        void apply(inout exponent_t stored, out exponent_t result) {
            stored = max(stored, hdr.agg.exponent);
            result = stored;
        }
    };

    RegisterAction<exponent_t, cell_t, exponent_t>(exponents) load_exponent = {
        void apply(inout exponent_t stored, out exponent_t result) {
            result = stored;
        }
    };

    action write_exponent() {
        hdr.agg.exponent = store_exponent.execute(meta.cell);
    }

    action max_exponent() {
        hdr.agg.exponent = max_of_exponents.execute(meta.cell);
    }

    action read_exponent() {
        hdr.agg.exponent = load_exponent.execute(meta.cell);
    }

    table register_op {
        key = {
            aggregate:      ternary @name("aggregate");
            meta.worker_id: ternary @name("worker_id");
            bitmap_before:  ternary @name("bitmap_before");
            release:        ternary @name("release");
            released[0:0]:  ternary @name("released");
            age[3:0]:       ternary @name("age");
        }
        actions = { write_exponent; max_exponent; read_exponent; NoAction; }
        const entries = {
            // aggregate worker_id bitmap_before release released age
            (0, _, _, _, _, _): NoAction();           // not a checked contribution
            (1, _, _, _, _, AGE_STALE): NoAction();   // stale: its round is gone
            (1, _, _, 1, _, _): read_exponent();      // a RELEASE
            (1, _, _, _, 1, _): read_exponent();      // a released round
            (1, _, 0, _, _, _): write_exponent();     // WRITE: first contribution
#define SEEN(w) (1, w, SEEN_BIT(w), _, _, _): read_exponent();
            FOR_EACH_WORKER(SEEN)                     // READ: retransmission
#undef SEEN
            (1, _, _, _, _, _): max_exponent();       // ADD: a further worker
        }
        const default_action = NoAction();   // never taken: the entries cover all
        size = 40;
    }

    apply {
        register_op.apply();
    }
}

#endif  // _TNA_EXPONENT_MAX_P4_
