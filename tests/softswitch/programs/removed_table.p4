/*
 * A table that stays in the P4Info but that p4c removes from the JSON: "dead" is
 * applied only in a switch in the else branch of a condition that is always true
 * (its branch returns), so p4c drops that code and the table with it. Table
 * "kept" is applied normally (misses go to port 3).
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

struct headers_t {
    ethernet_h ethernet;
}

struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta,
         inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    action forward(bit<9> port) { sm.egress_spec = port; }
    action tag(bit<16> t) { hdr.ethernet.ether_type = t; }

    table kept {
        key = { hdr.ethernet.dst: exact @name("dst"); }
        actions = { forward; }
        default_action = forward(3);
        size = 16;
    }

    table dead {
        key = { hdr.ethernet.src: exact @name("src"); }
        actions = { tag; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    apply {
        bit<8> limit = 3;
        kept.apply();
        if (limit < 7) {
            return;
        } else {
            switch (dead.apply().action_run) {
                tag: { hdr.ethernet.src = 0; }
            }
        }
    }
}

control Egr(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply { }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.ethernet); }
}

V1Switch(P(), VC(), Ing(), Egr(), CC(), D()) main;
