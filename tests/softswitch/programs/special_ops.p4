/* Special operations (tests/softswitch/test_special_ops.py): clone I2E and E2E with and
   without a field list, resubmit and recirculate counting passes, an endless resubmit.
   Egress puts a report header after Ethernet saying what each copy saw. */
#include <core.p4>
#include <v1model.p4>

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
/* The test's command: what to do, a session or a count, and a value. */
header cmd_t { bit<8> op; bit<8> arg; bit<16> value; }
header report_t {
    bit<32> instance_type;   /* in egress */
    bit<8>  ingress_type;    /* instance_type as ingress last saw it */
    bit<8>  passes;
    bit<16> kept;            /* in field list 1 */
    bit<16> lost;            /* in no field list */
    bit<16> ingress_port;
    bit<16> egress_rid;
    bit<16> packet_length;
}

struct meta_t {
    @field_list(1) bit<16> kept;
    bit<16> lost;
    @field_list(1) bit<8> passes;
    bit<8> ingress_type;
}
struct headers_t { eth_t eth; cmd_t cmd; report_t report; }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.type) { 0x88b5: parse_cmd; default: accept; }
    }
    state parse_cmd {
        pkt.extract(hdr.cmd);
        transition select(hdr.cmd.op) { 0xff: parse_report; default: accept; }
    }
    state parse_report { pkt.extract(hdr.report); transition accept; }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply { } }

control I(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    action i2e(bit<32> session) {
        clone_preserving_field_list(CloneType.I2E, session, 1);
    }
    action i2e_plain(bit<32> session) {
        clone(CloneType.I2E, session);
    }
    table clone_table {
        key = { hdr.cmd.op: exact; }
        actions = { i2e; i2e_plain; NoAction; }
        default_action = NoAction();
    }
    apply {
        meta.ingress_type = (bit<8>) sm.instance_type;
        sm.egress_spec = 4;
        if (!hdr.cmd.isValid()) { return; }
        if (sm.instance_type == 0) {
            meta.kept = hdr.cmd.value;
            meta.lost = 0x2222;
        }
        if (hdr.cmd.op == 1) {
            i2e((bit<32>) hdr.cmd.arg);
            hdr.eth.src = 0x0a0a0a0a0a0a;   /* not seen by the I2E clone */
        } else if (hdr.cmd.op == 6) {
            clone_table.apply();
        } else if (hdr.cmd.op == 3 && meta.passes < hdr.cmd.arg) {
            meta.passes = meta.passes + 1;
            hdr.eth.src = 0x0b0b0b0b0b0b;   /* lost: resubmit runs the original again */
            resubmit_preserving_field_list(1);
        } else if (hdr.cmd.op == 5) {
            resubmit_preserving_field_list(1);   /* for ever: the switch bounds it */
        } else if (hdr.cmd.op == 7) {
            sm.mcast_grp = 1;
            clone_preserving_field_list(CloneType.I2E, (bit<32>) hdr.cmd.arg, 1);
        } else if (hdr.cmd.op == 8 && sm.instance_type == 0) {
            clone_preserving_field_list(CloneType.I2E, (bit<32>) hdr.cmd.arg, 1);
            resubmit_preserving_field_list(1);   /* the clone, then the resubmit: no forwarding */
            meta.passes = 200;
        }
    }
}

control E(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        if (!hdr.cmd.isValid()) { return; }
        if (hdr.cmd.op == 4 && meta.passes < hdr.cmd.arg) {
            meta.passes = meta.passes + 1;
            hdr.eth.dst = hdr.eth.dst + 1;      /* seen by the next pass */
            recirculate_preserving_field_list(1);
            return;
        }
        if (hdr.cmd.op == 9) {
            recirculate_preserving_field_list(1);   /* for ever: the switch bounds it */
            return;
        }
        if (hdr.cmd.op == 2 && sm.instance_type == 0) {
            hdr.eth.src = 0x0c0c0c0c0c0c;      /* seen by the E2E clone */
            meta.lost = 0x3333;
            clone_preserving_field_list(CloneType.E2E, (bit<32>) hdr.cmd.arg, 1);
            if (hdr.cmd.value == 0xdead) { mark_to_drop(sm); }   /* the clone still goes */
        }
        if (hdr.cmd.op == 10) {
            clone_preserving_field_list(CloneType.E2E, (bit<32>) hdr.cmd.arg, 1);   /* for ever */
        }
        hdr.report.setValid();
        hdr.report.instance_type = sm.instance_type;
        hdr.report.ingress_type = meta.ingress_type;
        hdr.report.passes = meta.passes;
        hdr.report.kept = meta.kept;
        hdr.report.lost = meta.lost;
        hdr.report.ingress_port = (bit<16>) sm.ingress_port;
        hdr.report.egress_rid = sm.egress_rid;
        hdr.report.packet_length = (bit<16>) sm.packet_length;
    }
}

control CC(inout headers_t hdr, inout meta_t meta) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.eth); pkt.emit(hdr.cmd); pkt.emit(hdr.report); }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
