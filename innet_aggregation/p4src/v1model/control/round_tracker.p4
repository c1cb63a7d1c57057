/*
 * Per (slot, set) of a deadline job: the packet id of its round and whether the round
 * was released (deadline.p4). One read-modify-write per packet: the first packet of a
 * newer round writes its id, a release sets the flag, anything else only reads.
 * Jobs without a deadline never touch it, so they behave exactly as before.
 */
#ifndef _ROUND_TRACKER_P4_
#define _ROUND_TRACKER_P4_

control RoundTracker(in headers_t hdr, in metadata_t meta, inout deadline_t d) {
    // {released (bit 32), packet id (bits 31..0)}
    register<bit<64>>(NUM_CELLS) rounds;

    action set_deadline() {
        d.on = 1;
    }

    table deadline_jobs {
        key = { hdr.agg.job_id: exact @name("job_id"); }
        actions = { set_deadline; @defaultonly NoAction; }
        const default_action = NoAction();
        size = MAX_JOBS;
    }

    action track() {
        bit<64> word;
        rounds.read(word, (bit<32>)meta.cell);
        pkt_id_t id = word[31:0];
        bit<1> was_released = word[32:32];
        bit<32> behind = id - hdr.agg.pkt_id;
        bit<1> same = (behind == 0) ? 1w1 : 1w0;
        d.stale = (behind != 0 && behind < STALE_ROUNDS) ? 1w1 : 1w0;
        d.fresh = (same == 0 && d.stale == 0 && d.release == 0) ? 1w1 : 1w0;
        // A release for an id the cell has not seen (a newer one): nobody has
        // contributed to that round yet.
        d.empty = (same == 0 && d.stale == 0 && d.release == 1) ? 1w1 : 1w0;
        d.released = (same == 1) ? was_released : 1w0;
        // A release of the round sets the flag for the workers still to come (of a
        // finished round too: NextStepSelector answers those with the full result).
        bit<1> flag = (same == 1 && d.release == 1) ? 1w1 : was_released;
        rounds.write((bit<32>)meta.cell, (d.fresh == 1) ? (32w0 ++ hdr.agg.pkt_id)
                                                        : (31w0 ++ flag ++ id));
    }

    apply {
        if (deadline_jobs.apply().hit) {
            track();
        }
    }
}

#endif  // _ROUND_TRACKER_P4_
