/*
 * Header stacks assigned as a whole, and the last element read in a parser assignment.
 * The parser loops tags into a stack (tags.next), adding tags.last.value into a sum
 * as it goes; a tag whose `more` is 2 copies the stack (next included) into a second
 * one, whose next element the parser then extracts, so the copy's next shows in the
 * frame. Ingress copies the stack again after popping it (op 1 in the low byte of the
 * Ethernet source), or after making an element invalid (op 2), and writes the sum and
 * the last value into the Ethernet destination. Frames leave on port 2, or 3 after a
 * parser error.
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
    tag_h[3] tags;
    tag_h[3] copy;
}

struct meta_t {
    bit<16> last_value;
    bit<16> sum;
}

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
        meta.last_value = hdr.tags.last.value;
        meta.sum = meta.sum + hdr.tags.last.value;
        transition select(hdr.tags.last.more) {
            1: parse_tag;
            2: copy_then_tag;
            default: accept;
        }
    }
    state copy_then_tag {
        hdr.copy = hdr.tags;
        pkt.extract(hdr.copy.next);
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
        bit<8> op = hdr.ethernet.src[7:0];
        if (op == 1) {
            hdr.tags.pop_front(1);
            hdr.copy = hdr.tags;
        } else if (op == 2) {
            hdr.tags[0].setInvalid();
            hdr.copy = hdr.tags;
        }
        hdr.ethernet.dst[31:0] = meta.sum ++ meta.last_value;
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
        pkt.emit(hdr.copy);
    }
}

V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
