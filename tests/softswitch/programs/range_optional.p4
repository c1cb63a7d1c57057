/*
 * Range and optional match kinds: a classifier keyed by a range on the UDP-like
 * destination port, an optional match on the protocol byte and a ternary one on
 * the Ethernet destination's low byte; the entry picked (written over P4Runtime
 * with priorities) sets the egress port and tags the frame. A second table keys on
 * a range alone (the IPv4-like length) to check bounds at the edges and an
 * optional alone, and a third holds const range entries that overlap (the first
 * one wins). log_msg calls in the parser, an action and the apply block do nothing.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header l4_h {
    bit<8> proto;
    bit<8> tag;
    bit<16> len;
    bit<16> dport;
    bit<8> mark;
}

struct headers_t {
    ethernet_h ethernet;
    l4_h l4;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x88b5: parse_l4;
            default: accept;
        }
    }
    state parse_l4 {
        pkt.extract(hdr.l4);
        log_msg("l4 proto {} dport {}", {hdr.l4.proto, hdr.l4.dport});
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    action route(bit<9> port, bit<8> tag) {
        sm.egress_spec = port;
        hdr.l4.tag = tag;
    }
    action to_drop() {
        mark_to_drop(sm);
    }
    action mark(bit<8> m) {
        log_msg("mark {}", {m});
        hdr.l4.mark = m;
    }
    action set_src(bit<8> v) {
        hdr.ethernet.src[15:8] = v;
    }
    table classify {
        key = {
            hdr.l4.dport: range;
            hdr.l4.proto: optional;
            hdr.ethernet.dst[7:0]: ternary;
        }
        actions = { route; to_drop; NoAction; }
        default_action = route(4, 0xee);
    }
    table by_len {
        key = {
            hdr.l4.len: range;
        }
        actions = { mark; NoAction; }
        default_action = NoAction();
    }
    table by_proto {
        key = {
            hdr.l4.proto: optional;
            hdr.ethernet.src[7:0]: exact;
        }
        actions = { mark; NoAction; }
        default_action = NoAction();
    }
    table const_ranges {
        key = {
            hdr.l4.dport: range;
        }
        actions = { set_src; }
        const entries = {
            0x20 .. 0x2f : set_src(1);
            0x28 .. 0x40 : set_src(2);
            0x40 .. 0x40 : set_src(3);
        }
        default_action = set_src(0xff);
    }
    apply {
        sm.egress_spec = 3;
        if (hdr.l4.isValid()) {
            log_msg("classifying");
            const_ranges.apply();
            classify.apply();
            if (by_len.apply().miss) {
                by_proto.apply();
            }
        }
    }
}

control Eg(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply { }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Dep(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.l4);
    }
}

V1Switch(P(), VC(), Ing(), Eg(), CC(), Dep()) main;
