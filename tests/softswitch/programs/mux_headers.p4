/*
 * A ?: whose operands are headers (p4c keeps it as an expression over headers):
 * as the source of a header assignment and under isValid(). ctl.sel picks a or b;
 * b is only in the frame when ctl.has_b is set.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ctl_h {
    bit<8> sel;
    bit<8> has_b;
}

header word_h {
    bit<16> v;
}

struct headers_t {
    ethernet_h ethernet;
    ctl_h      ctl;
    word_h     a;
    word_h     b;
    word_h     copy;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x88b5: parse_ctl;
            default: accept;
        }
    }
    state parse_ctl {
        pkt.extract(hdr.ctl);
        pkt.extract(hdr.a);
        transition select(hdr.ctl.has_b) {
            0: accept;
            default: parse_b;
        }
    }
    state parse_b {
        pkt.extract(hdr.b);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    action pick() {
        hdr.copy = hdr.ctl.sel != 0 ? hdr.a : hdr.b;
    }

    apply {
        if (!hdr.ctl.isValid()) {
            sm.egress_spec = 1;
        } else {
            pick();
            if ((hdr.ctl.sel != 0 ? hdr.a : hdr.b).isValid()) {
                sm.egress_spec = 2;
            } else {
                sm.egress_spec = 3;
            }
        }
    }
}

control Egr(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply { }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ctl);
        pkt.emit(hdr.a);
        pkt.emit(hdr.b);
        pkt.emit(hdr.copy);
    }
}

V1Switch(P(), VC(), Ing(), Egr(), CC(), D()) main;
