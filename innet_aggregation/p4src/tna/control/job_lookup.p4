/*
 * Binds an aggregation packet to a job: its worker count, multicast group and slot
 * range. Keyed on the UDP port too, so a job only answers on its own port.
 * Same table as v1model/control/job_lookup.p4, without its set_leaf_job: the TNA
 * program has the root role only.
 *
 * The slot range check differs. v1model tests slot - first_slot < num_slots; on
 * Tofino a gateway compares a field with a constant only, and the subtraction and
 * a saturating compare would take two stages after the lookup, which the bitmap
 * cannot wait for (the 35 stateful ALUs after it need nine of the twelve stages).
 * So a second table, slot_range, matches the slot against the job's range in the
 * same stage as jobs; the controller writes [first_slot, first_slot + num_slots - 1]
 * into it where the program has it (switch_ctl/controls.py, JobLookup).
 */
#ifndef _TNA_JOB_LOOKUP_P4_
#define _TNA_JOB_LOOKUP_P4_

control JobLookup(in tna_headers_t hdr, inout metadata_t meta, out bit<1> found,
                  out bit<1> in_range) {
    action set_job(count_t num_workers, count_t total_workers, mcast_group_t group,
                   slot_t first_slot, slot_t num_slots) {
        found = 1;
        meta.num_workers = num_workers;
        meta.total_workers = total_workers;
        meta.job_group = group;
        // first_slot and num_slots stay parameters, as on v1model, so one controller
        // writes both programs; here slot_range does the checking with them.
    }

    // The flags are written by the tables' own actions: a flag from apply().hit
    // would be a table of its own, one stage later.
    action unknown_job() {
        found = 0;
    }

    table jobs {
        key = {
            hdr.agg.job_id:   exact @name("job_id");
            hdr.udp.dst_port: exact @name("udp_port");
        }
        actions = { set_job; @defaultonly unknown_job; }
        const default_action = unknown_job();
        size = MAX_JOBS;
    }

    action slot_in_range() {
        in_range = 1;
    }

    action slot_out_of_range() {
        in_range = 0;
    }

    table slot_range {
        key = {
            hdr.agg.job_id:   exact @name("job_id");
            hdr.udp.dst_port: exact @name("udp_port");
            hdr.agg.slot:     range @name("slot");
        }
        actions = { slot_in_range; @defaultonly slot_out_of_range; }
        const default_action = slot_out_of_range();
        size = MAX_JOBS;
    }

    apply {
        jobs.apply();
        slot_range.apply();
    }
}

#endif  // _TNA_JOB_LOOKUP_P4_
