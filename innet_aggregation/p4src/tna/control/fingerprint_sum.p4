/*
 * The sum of the workers' call fingerprints for a (slot, set), wrapping: every
 * worker checks that a result carries n times its own.
 *
 * TNA form of v1model/control/fingerprint_sum.p4: one 32-bit Register, one
 * RegisterAction per v1model action (one stateful ALU), keyed like ExponentMax on
 * BitmapChecker's outputs. A retransmission reads, whether its slot is finished
 * (a resend carries the stored sum) or not (the packet is dropped, or leaves as a
 * WAITING reply, whose fingerprint field egress fills with the bitmap from
 * bridge_h). Pass 2 of a result does not touch it: pass 1 put the sum in the
 * packet. Nothing before `send` waits for it, so bf-p4c may place it in any stage
 * after the bitmap's with a stateful ALU free.
 */
#ifndef _TNA_FINGERPRINT_SUM_P4_
#define _TNA_FINGERPRINT_SUM_P4_

control FingerprintSum(inout tna_headers_t hdr,
                       in metadata_t meta,
                       in worker_bitmap_t bitmap_before,
                       in bit<1> aggregate) {
    Register<fingerprint_t, cell_t>(NUM_CELLS) fingerprints;

    RegisterAction<fingerprint_t, cell_t, fingerprint_t>(fingerprints) store_fingerprint = {
        void apply(inout fingerprint_t stored, out fingerprint_t result) {
            stored = hdr.agg.fingerprint;
            result = stored;
        }
    };

    RegisterAction<fingerprint_t, cell_t, fingerprint_t>(fingerprints) add_fingerprint = {
        void apply(inout fingerprint_t stored, out fingerprint_t result) {
            stored = stored + hdr.agg.fingerprint;
            result = stored;
        }
    };

    RegisterAction<fingerprint_t, cell_t, fingerprint_t>(fingerprints) load_fingerprint = {
        void apply(inout fingerprint_t stored, out fingerprint_t result) {
            result = stored;
        }
    };

    action write_fingerprint() {
        hdr.agg.fingerprint = store_fingerprint.execute(meta.cell);
    }

    action sum_fingerprint() {
        hdr.agg.fingerprint = add_fingerprint.execute(meta.cell);
    }

    action read_fingerprint() {
        hdr.agg.fingerprint = load_fingerprint.execute(meta.cell);
    }

    table register_op {
        key = {
            aggregate:      ternary @name("aggregate");
            meta.worker_id: ternary @name("worker_id");
            bitmap_before:  ternary @name("bitmap_before");
        }
        actions = { write_fingerprint; sum_fingerprint; read_fingerprint; NoAction; }
        const entries = {
            (0, _, _): NoAction();            // not a checked contribution
            (1, _, 0): write_fingerprint();   // WRITE: first contribution
#define SEEN(w) (1, w, SEEN_BIT(w)): read_fingerprint();
            FOR_EACH_WORKER(SEEN)             // READ: retransmission
#undef SEEN
            (1, _, _): sum_fingerprint();     // ADD: a further worker
        }
        const default_action = NoAction();   // never taken: the entries cover all
        size = 36;
    }

    apply {
        register_op.apply();
    }
}

#endif  // _TNA_FINGERPRINT_SUM_P4_
