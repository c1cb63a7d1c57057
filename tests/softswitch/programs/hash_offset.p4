/*
 * Hashes: v1model's hash() (BMv2's modify_field_with_hash_based_offset) with each
 * algorithm p4c offers but random, over fields that do not end on a byte boundary,
 * with constant and packet-given bases and sizes (a size of 0 is taken as 1), into a
 * narrow field (truncated); and checksums over the payload, verified and updated.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_h { bit<48> dst; bit<48> src; bit<16> ether_type; }
header in_h { bit<16> base; bit<16> size; bit<8> x; bit<32> y; bit<12> z; bit<4> k; bit<16> csum; }
header out_h {
    bit<16> crc16; bit<32> crc32; bit<16> crc16c; bit<32> crc32c; bit<16> csum16;
    bit<64> ident; bit<16> xor16; bit<16> offs; bit<8> narrow; bit<8> flags;
    bit<16> pay_sum; bit<16> pay_crc;
}
struct headers_t { ethernet_h ethernet; in_h i; out_h o; }
struct meta_t { }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) { 0x88b6: parse_in; default: accept; }
    }
    state parse_in { pkt.extract(hdr.i); transition accept; }
}
control VC(inout headers_t hdr, inout meta_t meta) {
    apply {
        verify_checksum_with_payload(hdr.i.isValid(), { hdr.i.x, hdr.i.y }, hdr.i.csum,
                                     HashAlgorithm.csum16);
    }
}
control Ing(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 2;
        if (!hdr.i.isValid()) { return; }
        hdr.o.setValid();
        hash(hdr.o.crc16, HashAlgorithm.crc16, 16w0, { hdr.i.x, hdr.i.y, hdr.i.z }, 32w65536);
        hash(hdr.o.crc32, HashAlgorithm.crc32, 32w0, { hdr.i.x, hdr.i.y, hdr.i.z },
             64w0x100000000);
        hash(hdr.o.crc16c, HashAlgorithm.crc16_custom, 16w0, { hdr.i.y, hdr.i.k }, 32w65536);
        hash(hdr.o.crc32c, HashAlgorithm.crc32_custom, 32w7, { hdr.i.z, hdr.i.x }, 32w1000);
        hash(hdr.o.csum16, HashAlgorithm.csum16, 16w0, { hdr.i.x, hdr.i.y, hdr.i.z }, 32w65536);
        hash(hdr.o.ident, HashAlgorithm.identity, 64w0, { hdr.i.y, hdr.i.x, hdr.i.z, hdr.i.k },
             64w0xffffffffffffffff);
        hash(hdr.o.xor16, HashAlgorithm.xor16, 16w0, { hdr.i.x, hdr.i.y, hdr.i.z }, 32w65536);
        hash(hdr.o.offs, HashAlgorithm.crc32, hdr.i.base, { hdr.i.x, hdr.i.y }, hdr.i.size);
        hash(hdr.o.narrow, HashAlgorithm.crc16, 8w200, { hdr.i.y }, 16w1000);
        hdr.o.flags = (bit<8>)sm.checksum_error;
    }
}
control Eg(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) { apply { } }
control CC(inout headers_t hdr, inout meta_t meta) {
    apply {
        update_checksum_with_payload(hdr.o.isValid(), { hdr.i.x, 4w3 }, hdr.o.pay_sum,
                                     HashAlgorithm.csum16);
        update_checksum_with_payload(hdr.o.isValid(), { hdr.i.y }, hdr.o.pay_crc,
                                     HashAlgorithm.crc16);
    }
}
control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.ethernet); pkt.emit(hdr.i); pkt.emit(hdr.o); }
}
V1Switch(P(), VC(), Ing(), Eg(), CC(), D()) main;
