/*
 * Plain L2 switching for everything that is not aggregation (gloo's TCP, ssh, ARP):
 * known MACs go to their port, everything else floods through FLOOD_MCAST_GROUP.
 */
#ifndef _L2_FORWARDING_P4_
#define _L2_FORWARDING_P4_

control L2Forwarding(in headers_t hdr,
                     inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    action forward(port_t port) {
        standard_metadata.egress_spec = port;
    }

    action flood() {
        standard_metadata.mcast_grp = FLOOD_MCAST_GROUP;
        meta.flooded = true;  // egress prunes the copy to the ingress port
    }

    table mac_table {
        key = { hdr.ethernet.dst_addr: exact @name("dst_mac"); }
        actions = { forward; flood; }
        const default_action = flood();
        size = L2_TABLE_SIZE;
    }

    apply {
        mac_table.apply();
    }
}

#endif  // _L2_FORWARDING_P4_
