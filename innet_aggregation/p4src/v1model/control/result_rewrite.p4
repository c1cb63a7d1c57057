/*
 * Egress: addresses one copy of a result to its worker. Multicast copies name the
 * worker by their replica id (the controller sets rid = worker id); a unicast
 * resend goes back to the sender ingress identified.
 */
#ifndef _RESULT_REWRITE_P4_
#define _RESULT_REWRITE_P4_

control ResultRewrite(inout headers_t hdr,
                      inout standard_metadata_t standard_metadata,
                      in job_id_t job_id,
                      in worker_id_t worker_id) {
    action set_worker_address(mac_addr_t mac, ipv4_addr_t ip, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = ip;
        hdr.udp.dst_port = udp_port;
    }

    action drop_unaddressed() {
        mark_to_drop(standard_metadata);
    }

    table workers {
        key = {
            job_id:    exact @name("job_id");
            worker_id: exact @name("worker_id");
        }
        actions = { set_worker_address; @defaultonly drop_unaddressed; }
        const default_action = drop_unaddressed();
        size = SENDER_TABLE_SIZE;
    }

    apply {
        workers.apply();
    }
}

#endif  // _RESULT_REWRITE_P4_
