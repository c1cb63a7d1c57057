/*
 * Stacks of header unions. The parser loops: a kind byte says which member of the
 * stack's next element to extract (us.next.a or us.next.b, its low nibble) and whether
 * to go on (high nibble 1), or to copy the whole stack, next included, into a second
 * one and extract the next kind into it (high nibble 3: the copy's next shows in the
 * frame); a fourth element is StackOutOfBounds. Ingress pushes and pops the stack by
 * the op in the low byte of the Ethernet source (BMv2 swaps the unions and, unlike
 * a stack of headers, leaves the emptied elements as the swaps left them), copies it
 * as a whole, makes a member of an element valid and writes it, and reads members by
 * constant index. (p4c writes us[2].isValid() as a header BMv2 does not have, so it is
 * spelled out member by member.) Frames leave on port 2, or 3 after a parser error.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header kind_h {
    bit<8> kind;
}

header a_h {
    bit<8> a;
}

header b_h {
    bit<24> b;
}

header_union ab_u {
    a_h a;
    b_h b;
}

struct headers_t {
    ethernet_h ethernet;
    kind_h[4] kinds;
    ab_u[3] us;
    ab_u[3] copy;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x88b5: parse_kind;
            default: accept;
        }
    }
    state parse_kind {
        pkt.extract(hdr.kinds.next);
        transition select(hdr.kinds.last.kind) {
            0x0a &&& 0x0f: parse_a;
            0x0b &&& 0x0f: parse_b;
            default: accept;
        }
    }
    state parse_a {
        pkt.extract(hdr.us.next.a);
        transition select(hdr.kinds.last.kind) {
            0x1a: parse_kind;
            0x3a: copy_all;
            default: accept;
        }
    }
    state parse_b {
        pkt.extract(hdr.us.next.b);
        transition select(hdr.kinds.last.kind) {
            0x1b: parse_kind;
            0x3b: copy_all;
            default: accept;
        }
    }
    state copy_all {
        hdr.copy = hdr.us;
        pkt.extract(hdr.kinds.next);
        transition select(hdr.kinds.last.kind) {
            0x0a: copy_a;
            default: copy_b;
        }
    }
    state copy_a {
        pkt.extract(hdr.copy.next.a);
        transition accept;
    }
    state copy_b {
        pkt.extract(hdr.copy.next.b);
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
            hdr.us.push_front(1);
        } else if (op == 2) {
            hdr.us.pop_front(1);
        } else if (op == 3) {
            hdr.us.push_front(2);
            hdr.us[0].a.setValid();
            hdr.us[0].a.a = 0x77;
        } else if (op == 4) {
            hdr.us.pop_front(5);
        } else if (op == 5) {
            hdr.copy = hdr.us;
            hdr.copy[1].b.setValid();
            hdr.copy[1].b.b = 0xB0B0B0;
        }
        if (hdr.us[1].b.isValid()) {
            hdr.ethernet.dst[7:0] = hdr.us[1].b.b[7:0];
        }
        if (hdr.us[2].a.isValid() || hdr.us[2].b.isValid()) {
            hdr.ethernet.dst[15:8] = 0xEE;
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
        pkt.emit(hdr.kinds);
        pkt.emit(hdr.us);
        pkt.emit(hdr.copy);
    }
}

V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
