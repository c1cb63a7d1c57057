/*
 * Binds an aggregation packet to a job: its worker count, multicast group, slot
 * range and role (root, or leaf with a parent switch). Keyed on the UDP port too,
 * so a job only answers on its own port.
 */
#ifndef _JOB_LOOKUP_P4_
#define _JOB_LOOKUP_P4_

control JobLookup(in headers_t hdr, inout metadata_t meta, out bool found) {
    // The root of a tree, or a job on one switch: results go back to the workers.
    action set_job(count_t num_workers, count_t total_workers, mcast_group_t group,
                   slot_t first_slot, slot_t num_slots) {
        meta.num_workers = num_workers;
        meta.total_workers = total_workers;
        meta.job_group = group;
        meta.first_slot = first_slot;
        meta.num_slots = num_slots;
        meta.has_parent = 0;
    }

    // A leaf: its local sum goes to the parent as one contribution, from this
    // switch's service address to the parent's, out of parent_port.
    action set_leaf_job(count_t num_workers, count_t total_workers, mcast_group_t group,
                        slot_t first_slot, slot_t num_slots,
                        port_t parent_port, mac_addr_t parent_mac, ipv4_addr_t parent_ip) {
        set_job(num_workers, total_workers, group, first_slot, num_slots);
        meta.has_parent = 1;
        meta.parent_port = parent_port;
        meta.parent_mac = parent_mac;
        meta.parent_ip = parent_ip;
    }

    table jobs {
        key = {
            hdr.agg.job_id:   exact @name("job_id");
            hdr.udp.dst_port: exact @name("udp_port");
        }
        actions = { set_job; set_leaf_job; @defaultonly NoAction; }
        const default_action = NoAction();
        size = MAX_JOBS;
    }

    apply {
        found = jobs.apply().hit;
    }
}

#endif  // _JOB_LOOKUP_P4_
