/*
 * An L2/L3 switch for the softswitch's table, PRE, counter, register and checksum
 * tests, driven over P4Runtime: exact, LPM and ternary tables, const entries,
 * default actions, multicast with egress pruning, and the IPv4 checksum.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ipv4_h {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

struct headers_t {
    ethernet_h ethernet;
    ipv4_h     ipv4;
}

struct meta_t {
    bool flooded;
    bit<8> dscp_class;
}

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x0800: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    counter(512, CounterType.packets_and_bytes) port_packets;
    counter(4, CounterType.packets) class_packets;
    register<bit<8>>(512) last_ttl;

    action drop() { mark_to_drop(sm); }

    direct_counter(CounterType.packets_and_bytes) mac_hits;

    action forward(bit<9> port) { sm.egress_spec = port; }

    action flood() {
        sm.mcast_grp = 1;
        meta.flooded = true;
    }

    table mac_table {
        key = { hdr.ethernet.dst: exact @name("dst"); }
        actions = { forward; flood; }
        default_action = flood();
        counters = mac_hits;
        size = 64;
    }

    action route(bit<9> port, bit<48> next_mac) {
        sm.egress_spec = port;
        hdr.ethernet.src = hdr.ethernet.dst;
        hdr.ethernet.dst = next_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    table routes {
        key = { hdr.ipv4.dst_addr: lpm @name("dst_addr"); }
        actions = { route; drop; }
        default_action = drop();
        size = 64;
    }

    action set_port(bit<9> port) { sm.egress_spec = port; }

    table acl {
        key = {
            hdr.ipv4.src_addr: ternary @name("src_addr");
            hdr.ipv4.protocol: ternary @name("protocol");
        }
        actions = { drop; set_port; NoAction; }
        default_action = NoAction();
        size = 64;
    }

    action classify(bit<8> cls) { meta.dscp_class = cls; }

    table dscp {
        key = { hdr.ipv4.diffserv: ternary @name("diffserv"); }
        actions = { classify; NoAction; }
        const entries = {
            0xB8 &&& 0xFC: classify(3);
            0x00 &&& 0xE0: classify(0);
            0x20 &&& 0x20: classify(1);
            _: classify(2);
        }
        const default_action = NoAction();
    }

    apply {
        port_packets.count((bit<32>)sm.ingress_port);
        if (hdr.ipv4.isValid()) {
            last_ttl.write((bit<32>)sm.ingress_port, hdr.ipv4.ttl);
            dscp.apply();
            class_packets.count((bit<32>)meta.dscp_class);
            hdr.ipv4.identification = (bit<16>)meta.dscp_class;
            routes.apply();
            acl.apply();
        } else {
            mac_table.apply();
        }
    }
}

control Egr(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        if (meta.flooded && sm.egress_port == sm.ingress_port) {
            mark_to_drop(sm);
        }
    }
}

control CC(inout headers_t hdr, inout meta_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset,
              hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
    }
}

V1Switch(P(), VC(), Ing(), Egr(), CC(), D()) main;
