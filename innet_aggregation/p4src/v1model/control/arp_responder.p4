/*
 * Answers ARP requests for the aggregation service addresses, so workers reach the
 * switch with an ordinary UDP socket and no static neighbour entries.
 */
#ifndef _ARP_RESPONDER_P4_
#define _ARP_RESPONDER_P4_

control ArpResponder(inout headers_t hdr,
                     inout standard_metadata_t standard_metadata,
                     out bool replied) {
    action reply(mac_addr_t mac) {
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        hdr.arp.oper = ARP_OPER_REPLY;
        hdr.arp.target_mac = hdr.arp.sender_mac;
        ipv4_addr_t asked = hdr.arp.target_ip;
        hdr.arp.target_ip = hdr.arp.sender_ip;
        hdr.arp.sender_mac = mac;
        hdr.arp.sender_ip = asked;
        standard_metadata.egress_spec = standard_metadata.ingress_port;
    }

    table arp_table {
        key = { hdr.arp.target_ip: exact @name("target_ip"); }
        actions = { reply; @defaultonly NoAction; }
        const default_action = NoAction();
        size = ARP_TABLE_SIZE;
    }

    apply {
        replied = false;
        if (hdr.arp.isValid() && hdr.arp.oper == ARP_OPER_REQUEST
                && hdr.arp.htype == 1 && hdr.arp.ptype == ETHERTYPE_IPV4) {
            replied = arp_table.apply().hit;
        }
    }
}

#endif  // _ARP_RESPONDER_P4_
