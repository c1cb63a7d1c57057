/*
 * The sum of the workers' call fingerprints for a (slot, set), wrapping like an
 * unsigned add. Every worker derives its fingerprint from the call it issued (its
 * session, sequence number, size and the block's place in it) and checks that the
 * result carries n times its own: workers that issued different calls, or a stored
 * sum of another session's, cannot pass unseen. The switch compares nothing; it
 * adds, as it adds the values, in one read-modify-write per packet.
 *
 * A release (deadline.p4) writes who is in the round over the sum instead: the
 * RELEASED packet carries that bitmap where a result carries the sum, to every
 * worker then and to each that comes later.
 */
#ifndef _FINGERPRINT_SUM_P4_
#define _FINGERPRINT_SUM_P4_

control FingerprintSum(inout headers_t hdr, in metadata_t meta, in deadline_t d) {
    register<fingerprint_t>(NUM_CELLS) fingerprints;

    action write_fingerprint() {
        fingerprints.write((bit<32>)meta.cell, hdr.agg.fingerprint);
    }

    action add_fingerprint() {
        fingerprint_t stored;
        fingerprints.read(stored, (bit<32>)meta.cell);
        hdr.agg.fingerprint = stored + hdr.agg.fingerprint;
        fingerprints.write((bit<32>)meta.cell, hdr.agg.fingerprint);
    }

    action read_fingerprint() {
        fingerprints.read(hdr.agg.fingerprint, (bit<32>)meta.cell);
    }

    table register_op {
        key = { meta.register_op: exact @name("op"); }
        actions = { write_fingerprint; add_fingerprint; read_fingerprint; NoAction; }
        const entries = {
            RegisterOp.WRITE: write_fingerprint();
            RegisterOp.ADD:   add_fingerprint();
            RegisterOp.READ:  read_fingerprint();
        }
        const default_action = NoAction();
    }

    action record_contributors() {
        fingerprints.write((bit<32>)meta.cell, meta.contributors);
        hdr.agg.fingerprint = meta.contributors;
    }

    apply {
        if (d.record == 1) {
            record_contributors();
        } else {
            register_op.apply();
        }
    }
}

#endif  // _FINGERPRINT_SUM_P4_
