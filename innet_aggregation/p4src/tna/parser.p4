/*
 * Parsers and deparsers of both gresses (TNA, Tofino 1).
 *
 * Ingress parses everything, as v1model's AggParser, plus bridge_h on the
 * recirculation port (pass 2 of a result). Egress only parses what it rewrites:
 * bridge_h always, and Ethernet..agg_h of a result; the 256 B of values (and any
 * non-aggregation packet) pass through egress as payload.
 *
 * A too-short aggregation packet is not dropped by the parser: ingress reads
 * ig_intr_md_from_prsr.parser_err and counts it as MALFORMED, as v1model does with
 * parser_error. (To verify at first compile: Tofino drops on a parser error unless
 * the program reads parser_err.)
 */
#ifndef _TNA_PARSER_P4_
#define _TNA_PARSER_P4_

parser AggIngressParser(packet_in packet,
                        out tna_headers_t hdr,
                        out metadata_t meta,
                        out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        packet.extract(ig_intr_md);
        packet.advance(PORT_METADATA_SIZE);   // phase 0 port metadata: unused
        meta.is_agg = false;
        meta.known_sender = false;
        meta.flooded = false;
        transition select(ig_intr_md.ingress_port) {
            AGG_RECIRC_PORT: parse_bridge;
            default:         parse_ethernet;
        }
    }

    // Pass 2 of a result: what pass 1 decided travels in front of the packet.
    state parse_bridge {
        packet.extract(hdr.bridge);
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP:  parse_arp;
            default:        accept;
        }
    }

    // Only what ArpResponder answers is parsed as ARP: an Ethernet/IPv4 request
    // (htype 1, ptype 0x0800, oper 1). Testing that here spares ingress a
    // condition on 6 bytes, over a gateway's 4; anything else is switched as is.
    // Two states, as one state matches at most 32 bits (1 x 16 + 2 x 8).
    state parse_arp {
        transition select(packet.lookahead<arp_probe_h>().htype,
                          packet.lookahead<arp_probe_h>().ptype) {
            (1, ETHERTYPE_IPV4): parse_arp_oper;
            default:             accept;
        }
    }

    state parse_arp_oper {
        transition select(packet.lookahead<arp_probe_h>().oper) {
            ARP_OPER_REQUEST: parse_arp_request;
            default:          accept;
        }
    }

    state parse_arp_request {
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
        packet.extract(hdr.values);
        transition accept;
    }
}

control AggIngressDeparser(packet_out packet,
                           inout tna_headers_t hdr,
                           in metadata_t meta,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        // No checksum here: a result is re-addressed, and its checksum recomputed, in
        // egress; everything else leaves as it came.
        packet.emit(hdr.bridge);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.agg);
        packet.emit(hdr.values);
    }
}

parser AggEgressParser(packet_in packet,
                       out tna_headers_t hdr,
                       out egress_metadata_t meta,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        packet.extract(eg_intr_md);
        meta.update_ipv4_checksum = false;
        packet.extract(hdr.bridge);   // ingress always emits it
        transition select(hdr.bridge.next_step) {
            NextStep.MULTICAST: parse_ethernet;
            NextStep.UNICAST:   parse_ethernet;
            NextStep.WAITING:   parse_ethernet;
            default:            accept;   // L2 traffic: egress only needs the bridge
        }
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        packet.extract(hdr.ipv4);   // a result (or WAITING) is always Ethernet/IPv4/UDP/agg
        packet.extract(hdr.udp);
        packet.extract(hdr.agg);
        transition accept;
    }
}

control AggEgressDeparser(packet_out packet,
                          inout tna_headers_t hdr,
                          in egress_metadata_t meta,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        // Only results are rewritten at L3; everything else leaves as it came.
        if (meta.update_ipv4_checksum) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update(
                { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                  hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset,
                  hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        packet.emit(hdr.bridge);     // valid only on the way to the recirculation port
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.agg);
        packet.emit(hdr.values);     // never parsed in egress: stays payload
    }
}

#endif  // _TNA_PARSER_P4_
