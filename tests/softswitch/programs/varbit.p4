/*
 * Varbit fields: an option whose first byte gives its length in bytes (len: the
 * varbit takes len * 8 bits, at most 8 bytes: more is HeaderTooShort), extracted with
 * a length, then a fixed trailer. By the op in the low byte of the Ethernet source,
 * ingress copies the option into a second header (its length too) or invalidates it.
 * Frames leave on port 2, 3 after a parser error, 4 after HeaderTooShort.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h { bit<48> dst; bit<48> src; bit<16> ether_type; }
header opt_h { bit<8> len; bit<8> kind; varbit<64> data; }
header trailer_h { bit<16> magic; }
struct headers_t { ethernet_h ethernet; opt_h opt; opt_h opt2; trailer_h trailer; }
struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) { 0x88b5: parse_opt; default: accept; }
    }
    state parse_opt {
        bit<8> l = pkt.lookahead<bit<8>>();
        pkt.extract(hdr.opt, (bit<32>)l * 8);   /* the whole option is len + 2 bytes */
        transition parse_trailer;
    }
    state parse_trailer { pkt.extract(hdr.trailer); transition accept; }
}
control VC(inout headers_t hdr, inout meta_t meta) { apply { } }
control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 2;
        if (sm.parser_error != error.NoError) { sm.egress_spec = 3; }
        if (sm.parser_error == error.HeaderTooShort) { sm.egress_spec = 4; }
        if (hdr.ethernet.src[7:0] == 1) { hdr.opt2 = hdr.opt; }
        if (hdr.ethernet.src[7:0] == 2) { hdr.opt.setInvalid(); }
    }
}
control Eg(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) { apply { } }
control CC(inout headers_t hdr, inout meta_t meta) { apply { } }
control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.ethernet); pkt.emit(hdr.opt); pkt.emit(hdr.opt2); pkt.emit(hdr.trailer); }
}
V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
