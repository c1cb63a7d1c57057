/*
 * Derives the worker id from where the packet came from (ingress port, source IPv4,
 * source UDP port) within its job. Nothing in the packet names the worker, so a
 * host cannot contribute in another's place.
 * TNA form of v1model/control/sender_identification.p4: the port comes from
 * ig_intr_md.ingress_port.
 */
#ifndef _TNA_SENDER_IDENTIFICATION_P4_
#define _TNA_SENDER_IDENTIFICATION_P4_

control SenderIdentification(in tna_headers_t hdr,
                             inout metadata_t meta,
                             in port_t ingress_port) {
    // worker_bit is 1 << worker_id, computed by the controller: a variable shift
    // would cost a table on Tofino.
    action set_sender(worker_id_t worker_id, worker_bitmap_t worker_bit) {
        meta.known_sender = true;
        meta.worker_id = worker_id;
        meta.worker_bit = worker_bit;
    }

    table senders {
        key = {
            ingress_port:      exact @name("ingress_port");
            hdr.ipv4.src_addr: exact @name("src_ip");
            hdr.udp.src_port:  exact @name("src_udp_port");
            hdr.agg.job_id:    exact @name("job_id");
        }
        actions = { set_sender; @defaultonly NoAction; }
        const default_action = NoAction();
        size = SENDER_TABLE_SIZE;
    }

    // meta.known_sender starts false in the parser: a write here, before the
    // lookup, would push the table a stage down.
    apply {
        senders.apply();
    }
}

#endif  // _TNA_SENDER_IDENTIFICATION_P4_
