/*
 * Header stacks: a parser loop extracts up to four tags into a stack (tags.next),
 * selecting on the last one extracted (tags.last.more); a fifth is StackOutOfBounds.
 * Ingress pushes and pops by the op in the low byte of the Ethernet source
 * (push_front/pop_front by 1, 2 and more than the size), makes elements valid and
 * writes into them, and reads the valid ones. (BMv2 keeps an invalid header's fields
 * from earlier packets, so reading one is not compared.) Frames leave on port 2, or
 * 3 after a parser error.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header tag_h {
    bit<8> more;
    bit<8> kind;
    bit<16> value;
}

struct headers_t {
    ethernet_h ethernet;
    tag_h[4] tags;
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
        pkt.extract(hdr.tags.next);
        transition select(hdr.tags.last.more) {
            1: parse_tag;
            default: accept;
        }
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 2;
        if (sm.parser_error != error.NoError) {
            sm.egress_spec = 3;
        }
        bit<8> op = hdr.ethernet.src[7:0];
        if (op == 1) {
            hdr.tags.push_front(1);
            hdr.tags[0].setValid();
            hdr.tags[0].more = 0;
            hdr.tags[0].kind = 0xA1;
            if (hdr.tags[1].isValid()) {
                hdr.tags[0].value = hdr.tags[1].value + 1;
            }
        } else if (op == 2) {
            hdr.tags.push_front(2);
            hdr.tags[1].setValid();
            hdr.tags[1].kind = 0xB2;
        } else if (op == 3) {
            hdr.tags.pop_front(1);
        } else if (op == 4) {
            hdr.tags.pop_front(2);
            hdr.tags[3].setValid();
            hdr.tags[3].kind = 0xC3;
        } else if (op == 5) {
            hdr.tags.push_front(6);
        } else if (op == 6) {
            hdr.tags.pop_front(9);
        }
        if (hdr.tags[2].isValid()) {
            hdr.ethernet.dst[15:0] = hdr.tags[2].value;
        }
        if (hdr.tags[3].isValid()) {
            hdr.ethernet.dst[23:16] = hdr.tags[3].kind;
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
        pkt.emit(hdr.tags);
    }
}

V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
