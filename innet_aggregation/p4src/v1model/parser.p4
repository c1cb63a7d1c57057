/*
 * Parser, deparser and checksum controls.
 *
 * A malformed aggregation packet (too short) is not dropped here: v1model hands it
 * to ingress with parser_error set and values_h invalid, and ingress counts it.
 * (A WAITING reply has no values_h; ingress checks its length.)
 */
#ifndef _PARSER_P4_
#define _PARSER_P4_

parser AggParser(packet_in packet,
                 out headers_t hdr,
                 inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    state start {
        transition select(standard_metadata.ingress_port) {
            CPU_PORT: parse_packet_out;
            default:  parse_ethernet;
        }
    }

    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition accept;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP:  parse_arp;
            default:        accept;
        }
    }

    state parse_arp {
        packet.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        // Only unfragmented IPv4 without options can carry an aggregation packet.
        transition select(hdr.ipv4.ihl, hdr.ipv4.flags[0:0], hdr.ipv4.frag_offset,
                          hdr.ipv4.protocol) {
            (5, 0, 0, IP_PROTO_UDP): parse_udp;
            default:                 accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            AGG_UDP_PORT_BASE &&& AGG_UDP_PORT_MASK: parse_agg;
            default:                                 accept;
        }
    }

    state parse_agg {
        meta.is_agg = true;
        packet.extract(hdr.agg);
        // A WAITING reply (from a parent switch) is agg_h alone.
        transition select(hdr.agg.msg_type) {
            MsgType.WAITING: accept;
            default:         parse_values;
        }
    }

    state parse_values {
        packet.extract(hdr.values);
        transition accept;
    }
}

control AggVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control AggComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        // Only results are rewritten at L3; everything else leaves as it came.
        update_checksum(
            hdr.agg.isValid() && hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset,
              hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum,
            HashAlgorithm.csum16);
    }
}

control AggDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.agg);
        packet.emit(hdr.values);
    }
}

#endif  // _PARSER_P4_
