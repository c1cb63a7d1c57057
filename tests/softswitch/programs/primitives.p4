/*
 * One program exercising every primitive and expression form the softswitch
 * translates. hdr.t.op selects the case; results come back in r1..r4 / sr.
 */
#include <core.p4>
#include <v1model.p4>

error { BadOp }

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header test_h {
    bit<8>  op;
    bit<32> a;
    bit<32> b;
    int<16> sa;
    int<16> sb;
    bit<32> r1;
    bit<32> r2;
    bit<32> r3;
    bit<32> r4;
    int<16> sr;
    bit<4>  nib_hi;
    bit<4>  nib_lo;
}

header extra_h {
    bit<32> x;
}

struct headers_t {
    ethernet_h ethernet;
    test_h     t;
    extra_h    e1;
    extra_h    e2;
}

struct meta_t {
    bool    masked_type;
    bit<8>  tag;
}

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x88B5: parse_t;
            0x88B6: peek;
            0x8800 &&& 0xFF00: masked;
            default: accept;
        }
    }
    state peek {
        transition select(pkt.lookahead<bit<8>>()) {
            0x42: masked;
            default: accept;
        }
    }
    state masked {
        meta.masked_type = true;
        transition accept;
    }
    state parse_t {
        pkt.extract(hdr.t);
        verify(hdr.t.op != 0xEE, error.BadOp);
        transition select(hdr.t.op, hdr.t.a[7:0]) {
            (13, 0x01): parse_e1;
            (0xF0 &&& 0xF0, 0x02 &&& 0x0F): parse_e1_tagged;
            default: accept;
        }
    }
    state parse_e1_tagged {
        meta.tag = 7;
        transition parse_e1;
    }
    state parse_e1 {
        pkt.extract(hdr.e1);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    register<bit<32>>(16) reg;
    counter(8, CounterType.packets_and_bytes) ctr;

    action arith() {
        hdr.t.r1 = hdr.t.a + hdr.t.b;
        hdr.t.r2 = hdr.t.a - hdr.t.b;
        hdr.t.r3 = hdr.t.a * hdr.t.b;
        hdr.t.r4 = (hdr.t.a << 4) | (hdr.t.b >> 28);
    }

    action saturating() {
        hdr.t.r1 = hdr.t.a |+| hdr.t.b;
        hdr.t.r2 = hdr.t.a |-| hdr.t.b;
        hdr.t.sr = hdr.t.sa |+| hdr.t.sb;
        hdr.t.r3 = (bit<32>)(int<32>)(hdr.t.sa |-| hdr.t.sb);
    }

    action signed_ops() {
        hdr.t.sr = hdr.t.sa + hdr.t.sb;
        hdr.t.r1 = (bit<32>)(int<32>)hdr.t.sa;
        hdr.t.r2 = (hdr.t.sa < hdr.t.sb) ? 32w1 : 32w0;
        hdr.t.r3 = (bit<32>)(int<32>)(hdr.t.sa >> 2);
        hdr.t.r4 = (bit<32>)((int<32>)hdr.t.a |+| (int<32>)hdr.t.b);
    }

    action bits() {
        hdr.t.r1 = hdr.t.a[15:0] ++ hdr.t.b[31:16];
        hdr.t.r2 = (bit<32>)hdr.t.a[7:4];
        hdr.t.r3 = ~hdr.t.a;
        hdr.t.r4 = (hdr.t.a ^ hdr.t.b) & 0xFF00FF00 | 0x1;
        hdr.t.nib_hi = hdr.t.nib_lo;
        hdr.t.nib_lo = hdr.t.a[3:0] + 4w15;
    }

    action logic() {
        bool x = (hdr.t.a > hdr.t.b && !(hdr.t.a == 5)) || hdr.t.b == 7;
        hdr.t.r1 = x ? 32w1 : 32w2;
        hdr.t.r2 = (hdr.t.a != hdr.t.b) ? hdr.t.a : hdr.t.b;
        hdr.t.r3 = meta.masked_type ? 32w1 : 32w0;
        hdr.t.r4 = (bit<32>)meta.tag;
    }

    action registers() {
        bit<32> v;
        reg.read(v, hdr.t.b);
        v = v + hdr.t.a;
        reg.write(hdr.t.b, v);
        hdr.t.r1 = v;
        hdr.t.r2 = 0xABCD;
        reg.read(hdr.t.r2, 1000);   // out of range: BMv2 leaves r2 unchanged
    }

    // A cast index: p4c copies it into a temporary field before each use.
    action cast_index() {
        reg.read(hdr.t.r1, (bit<32>)hdr.t.sa[7:0]);
        reg.write((bit<32>)hdr.t.sa[7:0], hdr.t.a);
        reg.read(hdr.t.r2, (bit<32>)hdr.t.sa[7:0]);
    }

    action counting() {
        ctr.count(hdr.t.b);
    }

    action draw() {
        random(hdr.t.r1, 10, 20);
        random(hdr.t.r2, 0, 0xFFFFFFFF);
    }

    action headers_op() {
        hdr.e1.setValid();
        hdr.e1.x = hdr.t.a;
        hdr.e2 = hdr.e1;
        hdr.t.r1 = hdr.e2.isValid() ? 32w1 : 32w0;
    }

    action branchy() {
        if (hdr.t.a > 10) {
            hdr.t.r1 = 1;
            if (hdr.t.b == 0) {
                return;
            }
            hdr.t.r2 = 2;
        } else {
            hdr.t.r1 = 3;
        }
        hdr.t.r3 = 4;
    }

    apply {
        sm.egress_spec = sm.ingress_port;
        if (sm.parser_error == error.PacketTooShort) {
            hdr.ethernet.ether_type = 0xDEAD;
            sm.egress_spec = 3;
            exit;
        }
        if (sm.parser_error == error.BadOp) {
            sm.egress_spec = 4;
            exit;
        }
        if (!hdr.t.isValid()) {
            if (meta.masked_type) {
                hdr.ethernet.ether_type = 0xBEEF;
            }
            exit;
        }
        if (hdr.t.op == 1) { arith(); }
        else if (hdr.t.op == 2) { saturating(); }
        else if (hdr.t.op == 3) { signed_ops(); }
        else if (hdr.t.op == 4) { bits(); }
        else if (hdr.t.op == 5) { logic(); }
        else if (hdr.t.op == 6) { registers(); }
        else if (hdr.t.op == 7) { counting(); }
        else if (hdr.t.op == 8) { draw(); }
        else if (hdr.t.op == 9) { headers_op(); }
        else if (hdr.t.op == 10) { mark_to_drop(sm); }
        else if (hdr.t.op == 11) {
            hdr.t.r1 = 1;
            exit;
        }
        else if (hdr.t.op == 12) { sm.mcast_grp = (bit<16>)hdr.t.a; }
        else if (hdr.t.op == 13) { hdr.e1.setInvalid(); hdr.t.r1 = 13; }
        else if (hdr.t.op == 14) { sm.egress_spec = 511; }
        else if (hdr.t.op == 15) { branchy(); }
        else if (hdr.t.op == 16) { cast_index(); }
        if (hdr.t.op == 11) {
            hdr.t.r1 = 2;   // never reached: exit above
        }
        if (meta.tag == 7) {
            hdr.t.r4 = 0x7A6;
        }
    }
}

control Egr(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        if (hdr.t.isValid() && hdr.t.op == 12) {
            hdr.t.r3 = (bit<32>)sm.egress_port;
            hdr.t.r4 = (bit<32>)sm.egress_rid;
            hdr.t.r2 = sm.instance_type;
            if (sm.egress_rid == 9) {
                mark_to_drop(sm);
            }
        }
    }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.t);
        pkt.emit(hdr.e1);
        pkt.emit(hdr.e2);
    }
}

V1Switch(P(), VC(), Ing(), Egr(), CC(), D()) main;
