/*
 * A table whose match key has type error (the parser's error): P4Info gives it
 * bitwidth 0 and the entries name the error, the JSON gives it 32 bits.
 */
#include <core.p4>
#include <v1model.p4>

error { BadTag }

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header tag_h {
    bit<8> value;
}

struct headers_t {
    ethernet_h ethernet;
    tag_h      tag;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x88b5: parse_tag;
            default: accept;
        }
    }
    state parse_tag {
        pkt.extract(hdr.tag);
        verify(hdr.tag.value != 0xff, error.BadTag);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    action forward(bit<9> port) { sm.egress_spec = port; }
    action drop() { mark_to_drop(sm); }

    table by_error {
        key = { sm.parser_error: exact @name("err"); }
        actions = { forward; drop; }
        default_action = drop();
        size = 16;
    }

    apply { by_error.apply(); }
}

control Egr(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply { }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.tag);
    }
}

V1Switch(P(), VC(), Ing(), Egr(), CC(), D()) main;
