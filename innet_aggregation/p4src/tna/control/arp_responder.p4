/*
 * Answers ARP requests for the aggregation service addresses, so workers reach the
 * switch with an ordinary UDP socket and no static neighbour entries.
 * TNA form of v1model/control/arp_responder.p4: the reply leaves through
 * ucast_egress_port instead of egress_spec.
 */
#ifndef _TNA_ARP_RESPONDER_P4_
#define _TNA_ARP_RESPONDER_P4_

control ArpResponder(inout tna_headers_t hdr,
                     in port_t ingress_port,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md,
                     out bool replied) {
    action reply(mac_addr_t mac) {
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        hdr.arp.oper = ARP_OPER_REPLY;
        hdr.arp.target_mac = hdr.arp.sender_mac;
        ipv4_addr_t asked = hdr.arp.target_ip;   // a swap: one VLIW step on Tofino
        hdr.arp.target_ip = hdr.arp.sender_ip;
        hdr.arp.sender_mac = mac;
        hdr.arp.sender_ip = asked;
        ig_tm_md.ucast_egress_port = ingress_port;
    }

    table arp_table {
        key = { hdr.arp.target_ip: exact @name("target_ip"); }
        actions = { reply; @defaultonly NoAction; }
        const default_action = NoAction();
        size = ARP_TABLE_SIZE;
    }

    apply {
        replied = false;
        if (hdr.arp.isValid()) {   // an Ethernet/IPv4 request: the parser checked
            replied = arp_table.apply().hit;
        }
    }
}

#endif  // _TNA_ARP_RESPONDER_P4_
