/*
 * Plain L2 switching for everything that is not aggregation (gloo's TCP, ssh, ARP):
 * known MACs go to their port, everything else floods through FLOOD_MCAST_GROUP.
 * TNA form of v1model/control/l2_forwarding.p4: ucast_egress_port / mcast_grp_a.
 * Egress prunes the flood copy to the ingress port, as on v1model (the PRE's L2
 * exclusion id would do it natively, but needs a prune table the P4Runtime
 * controller does not program today).
 */
#ifndef _TNA_L2_FORWARDING_P4_
#define _TNA_L2_FORWARDING_P4_

control L2Forwarding(in tna_headers_t hdr,
                     inout metadata_t meta,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    action forward(port_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    action flood() {
        ig_tm_md.mcast_grp_a = FLOOD_MCAST_GROUP;
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

#endif  // _TNA_L2_FORWARDING_P4_
