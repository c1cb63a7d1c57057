/*
 * Header stack elements by a computed index: ingress reads and writes el[i] and el[j]
 * with i and j from the packet, signed fields among them, and by an index whose bounds
 * keep it inside the stack. With op 1 or 2 the index is not checked first, so an index
 * past the stack reaches the switch (BMv2 throws there and ends; the softswitch drops
 * the packet). Frames leave on port 2.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header idx_h {
    bit<8> op;
    bit<8> i;
    bit<8> j;
    int<8> s;
}

header elem_h {
    bit<8> a;
    int<8> b;
    bit<16> c;
}

struct headers_t {
    ethernet_h ethernet;
    idx_h idx;
    elem_h[3] el;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.idx);
        pkt.extract(hdr.el[0]);
        pkt.extract(hdr.el[1]);
        pkt.extract(hdr.el[2]);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 2;
        bit<8> i = hdr.idx.i;
        bit<8> j = hdr.idx.j;
        if (hdr.idx.op == 0 && i < 3 && j < 3) {
            hdr.el[i].a = hdr.el[j].a + 1;
            hdr.el[j].b = hdr.el[i].b - hdr.idx.s;
            hdr.el[(i + j) & 1].c = hdr.el[i].c ^ 0xFFFF;
            hdr.ethernet.ether_type = (bit<8>)hdr.el[j].b ++ hdr.el[(j + 1) & 1].a;
        } else if (hdr.idx.op == 1) {
            hdr.el[i].a = 0x55;
        } else if (hdr.idx.op == 2) {
            hdr.ethernet.ether_type = hdr.el[i].c;
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
        pkt.emit(hdr.idx);
        pkt.emit(hdr.el[0]);
        pkt.emit(hdr.el[1]);
        pkt.emit(hdr.el[2]);
    }
}

V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
