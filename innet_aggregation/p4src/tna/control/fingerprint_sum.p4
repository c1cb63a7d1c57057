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
                       in bit<1> aggregate,
                       in bit<1> release,
                       in bit<32> released,
                       in bit<32> age,
                       in bit<1> record) {
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

    // A release writes who is in the round over the sum: the RELEASED packet carries
    // that bitmap where a result carries the sum, to every worker then and to each
    // that comes later.
    RegisterAction<fingerprint_t, cell_t, fingerprint_t>(fingerprints) store_contributors = {
        void apply(inout fingerprint_t stored, out fingerprint_t result) {
            stored = bitmap_before;
            result = stored;
        }
    };

    action record_contributors() {
        hdr.agg.fingerprint = store_contributors.execute(meta.cell);
    }

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
            release:        ternary @name("release");
            released[0:0]:  ternary @name("released");
            age[3:0]:       ternary @name("age");
            record:         ternary @name("record");
        }
        actions = { write_fingerprint; sum_fingerprint; read_fingerprint; record_contributors;
                    NoAction; }
        const entries = {
            // aggregate worker_id bitmap_before release released age record
            (0, _, _, _, _, _, _): NoAction();              // not a checked contribution
            (1, _, _, _, _, _, 1): record_contributors();   // a release of an open round
            (1, _, _, _, _, AGE_STALE, _): NoAction();      // stale: its round is gone
            (1, _, _, 1, _, _, _): read_fingerprint();      // a RELEASE
            (1, _, _, _, 1, _, _): read_fingerprint();      // a released round: who is in it
            (1, _, 0, _, _, _, _): write_fingerprint();     // WRITE: first contribution
#define SEEN(w) (1, w, SEEN_BIT(w), _, _, _, _): read_fingerprint();
            FOR_EACH_WORKER(SEEN)                           // READ: retransmission
#undef SEEN
            (1, _, _, _, _, _, _): sum_fingerprint();       // ADD: a further worker
        }
        const default_action = NoAction();   // never taken: the entries cover all
        size = 41;
    }

    apply {
        register_op.apply();
    }
}

#endif  // _TNA_FINGERPRINT_SUM_P4_
