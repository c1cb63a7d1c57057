/*
 * Derives the worker id from where the packet came from (ingress port, source IPv4,
 * source UDP port) within its job. Nothing in the packet names the worker, so a
 * host cannot contribute in another's place. On a leaf, the parent switch is
 * identified the same way. A child switch is a worker to its parent.
 */
#ifndef _SENDER_IDENTIFICATION_P4_
#define _SENDER_IDENTIFICATION_P4_

control SenderIdentification(in headers_t hdr,
                             inout metadata_t meta,
                             in standard_metadata_t standard_metadata) {
    // worker_bit is 1 << worker_id, computed by the controller: a variable shift
    // would cost a table on Tofino.
    action set_sender(worker_id_t worker_id, worker_bitmap_t worker_bit) {
        meta.known_sender = true;
        meta.worker_id = worker_id;
        meta.worker_bit = worker_bit;
    }

    // The leaf's parent switch, identified the same way: only it may send results in.
    action set_parent() {
        meta.known_sender = true;
        meta.from_parent = 1;
    }

    table senders {
        key = {
            standard_metadata.ingress_port: exact @name("ingress_port");
            hdr.ipv4.src_addr:              exact @name("src_ip");
            hdr.udp.src_port:               exact @name("src_udp_port");
            hdr.agg.job_id:                 exact @name("job_id");
        }
        actions = { set_sender; set_parent; @defaultonly NoAction; }
        const default_action = NoAction();
        size = SENDER_TABLE_SIZE;
    }

    apply {
        meta.known_sender = false;
        meta.from_parent = 0;
        senders.apply();
    }
}

#endif  // _SENDER_IDENTIFICATION_P4_
