/*
 * Header unions: the Ethernet type picks which member of a union the parser
 * extracts (v4-like or v6-like tag, different sizes). Ingress reads the union's
 * validity, writes the valid member, and by the op in the low byte of the Ethernet
 * source makes another member valid (which invalidates the rest) or invalidates
 * one. The deparser emits the union. Frames leave on port 2, or 3 after a parser error.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header short_h {
    bit<8> kind;
    bit<8> value;
}

header long_h {
    bit<8> kind;
    bit<32> value;
    bit<8> extra;
}

header_union tag_u {
    short_h s;
    long_h l;
}

header trailer_h {
    bit<16> magic;
}

struct headers_t {
    ethernet_h ethernet;
    tag_u tag;
    trailer_h trailer;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x88b5: parse_short;
            0x88b6: parse_long;
            0x88b7: parse_both;
            default: accept;
        }
    }
    state parse_short {
        pkt.extract(hdr.tag.s);
        transition parse_trailer;
    }
    state parse_long {
        pkt.extract(hdr.tag.l);
        transition parse_trailer;
    }
    state parse_both {
        pkt.extract(hdr.tag.s);
        pkt.extract(hdr.tag.l);
        transition parse_trailer;
    }
    state parse_trailer {
        pkt.extract(hdr.trailer);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 2;
        if (sm.parser_error != error.NoError) {
            sm.egress_spec = 3;
        }
        if (hdr.tag.isValid()) {
            hdr.ethernet.dst[7:0] = 0xAA;
        }
        if (hdr.tag.s.isValid()) {
            hdr.ethernet.dst[15:8] = hdr.tag.s.value;
        }
        if (hdr.tag.l.isValid()) {
            hdr.ethernet.dst[23:16] = hdr.tag.l.extra;
        }
        bit<8> op = hdr.ethernet.src[7:0];
        if (op == 1) {
            hdr.tag.l.setValid();
            hdr.tag.l.kind = 0xB1;
            hdr.tag.l.value = 0x01020304;
            hdr.tag.l.extra = 7;
        } else if (op == 2) {
            hdr.tag.s.setValid();
            hdr.tag.s.kind = 0xA2;
            hdr.tag.s.value = 9;
        } else if (op == 3) {
            hdr.tag.s.setInvalid();
        } else if (op == 4) {
            hdr.tag.l.setInvalid();
        } else if (op == 5) {
            hdr.tag.s = { 0xC5, 0x33 };
        }
        if (hdr.tag.isValid()) {
            hdr.ethernet.src[15:8] = 0xBB;
        }
    }
}

control Eg(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply { }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.tag);
        pkt.emit(hdr.trailer);
    }
}

V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
