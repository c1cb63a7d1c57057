/*
 * Binds an aggregation packet to a job: its worker count, multicast group and slot
 * range. Keyed on the UDP port too, so a job only answers on its own port.
 * Same table as v1model/control/job_lookup.p4, without its set_leaf_job: the TNA
 * program has the root role only.
 *
 * The slot range check is v1model's slot - first_slot < num_slots, but a Tofino
 * gateway compares a field with a constant only: room = num_slots |-| offset
 * (saturating, so 0 once the offset reaches num_slots, and for a slot below
 * first_slot, whose offset wraps) leaves `room != 0` to the gateway.
 */
#ifndef _TNA_JOB_LOOKUP_P4_
#define _TNA_JOB_LOOKUP_P4_

control JobLookup(in tna_headers_t hdr, inout metadata_t meta, out bool found,
                  out slot_t room) {
    action set_job(count_t num_workers, count_t total_workers, mcast_group_t group,
                   slot_t first_slot, slot_t num_slots) {
        meta.num_workers = num_workers;
        meta.total_workers = total_workers;
        meta.job_group = group;
        meta.first_slot = first_slot;
        meta.num_slots = num_slots;
    }

    table jobs {
        key = {
            hdr.agg.job_id:   exact @name("job_id");
            hdr.udp.dst_port: exact @name("udp_port");
        }
        actions = { set_job; @defaultonly NoAction; }
        const default_action = NoAction();
        size = MAX_JOBS;
    }

    apply {
        found = jobs.apply().hit;
        slot_t offset = hdr.agg.slot - meta.first_slot;
        room = meta.num_slots |-| offset;
    }
}

#endif  // _TNA_JOB_LOOKUP_P4_
