/*
 * Varbit fields read: two options (a header, then the first element of a stack of
 * them), each a length byte (the varbit takes len * 8 bits, at most 8 bytes), a
 * checksum and the varbit. Ingress compares the varbits (BMv2 compares their values),
 * the headers as a whole, and a copy; the verify checksum covers a's length and
 * varbit, the update ones the varbits with constants that shift them off byte
 * boundaries (csum16 and crc16). The result header goes out after the options.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h { bit<48> dst; bit<48> src; bit<16> ether_type; }
header opt_h { bit<8> len; bit<16> csum; varbit<64> data; }
header result_h { bit<8> flags; bit<16> sum; bit<16> crc; }
struct headers_t { ethernet_h ethernet; opt_h a; opt_h[2] s; result_h res; }
struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) { 0x88b5: parse_a; default: accept; }
    }
    state parse_a {
        pkt.extract(hdr.a, (bit<32>)pkt.lookahead<bit<8>>() * 8);
        pkt.extract(hdr.s.next, (bit<32>)pkt.lookahead<bit<8>>() * 8);
        transition accept;
    }
}
control VC(inout headers_t hdr, inout meta_t meta) {
    apply {
        verify_checksum(hdr.a.isValid(), { hdr.a.len, hdr.a.data }, hdr.a.csum,
                        HashAlgorithm.csum16);
    }
}
control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 2;
        hdr.res.setValid();
        hdr.res.flags = 0;
        if (hdr.a.isValid() && hdr.s[0].isValid()) {   /* BMv2 leaves others stale */
            if (hdr.a.data == hdr.s[0].data) { hdr.res.flags = hdr.res.flags | 1; }
            if (hdr.a.data != hdr.s[0].data) { hdr.res.flags = hdr.res.flags | 2; }
        }
        if (hdr.a == hdr.s[0]) { hdr.res.flags = hdr.res.flags | 4; }
        if (sm.checksum_error == 1) { hdr.res.flags = hdr.res.flags | 8; }
        opt_h copy = hdr.a;
        if (copy.data == hdr.a.data && copy.isValid()) { hdr.res.flags = hdr.res.flags | 16; }
        if (sm.parser_error != error.NoError) { hdr.res.flags = hdr.res.flags | 128; }
    }
}
control Eg(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) { apply { } }
control CC(inout headers_t hdr, inout meta_t meta) {
    apply {
        update_checksum(hdr.res.isValid(), { 4w0xa, hdr.a.data, hdr.s[0].len, hdr.s[0].data, 4w5 },
                        hdr.res.sum, HashAlgorithm.csum16);
        update_checksum(hdr.res.isValid(), { hdr.a.data, 3w1, hdr.s[0].data },
                        hdr.res.crc, HashAlgorithm.crc16);
    }
}
control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.ethernet); pkt.emit(hdr.a); pkt.emit(hdr.s); pkt.emit(hdr.res); }
}
V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
