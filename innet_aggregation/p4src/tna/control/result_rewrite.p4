/*
 * Egress: addresses one copy of a result to its worker. Multicast copies name the
 * worker by their replica id (the controller sets rid = worker id); a unicast
 * resend goes back to the sender ingress identified.
 * TNA form of v1model/control/result_rewrite.p4: drop_ctl instead of mark_to_drop.
 */
#ifndef _TNA_RESULT_REWRITE_P4_
#define _TNA_RESULT_REWRITE_P4_

control ResultRewrite(inout tna_headers_t hdr,
                      inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                      in job_id_t job_id,
                      in worker_id_t worker_id) {
    action set_worker_address(mac_addr_t mac, ipv4_addr_t ip, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = ip;
        hdr.udp.dst_port = udp_port;
    }

    action drop_unaddressed() {
        eg_dprsr_md.drop_ctl = 1;
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

#endif  // _TNA_RESULT_REWRITE_P4_
