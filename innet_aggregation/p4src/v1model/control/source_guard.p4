/*
 * Port security: only the switch sources a job's service addresses. A frame from
 * any port whose Ethernet source, IPv4 source, ARP sender MAC or ARP sender IP is
 * a service address is a spoof (a forged result, or an ARP claim that would steer
 * the workers' traffic away from the switch), so ingress drops and counts it.
 */
#ifndef _SOURCE_GUARD_P4_
#define _SOURCE_GUARD_P4_

control SourceGuard(in headers_t hdr, out bool spoofed) {
    // The addresses a frame claims beyond its Ethernet source; zero when it has no
    // such header (reading an invalid header's fields is undefined).
    mac_addr_t  arp_sender_mac = 0;
    ipv4_addr_t src_ip = 0;

    // Ternary, so one lookup tests every claimed address: per job, one entry per
    // (field, service address), the other fields wildcards.
    table service_sources {
        key = {
            hdr.ethernet.src_addr: ternary @name("src_mac");
            arp_sender_mac:        ternary @name("arp_sender_mac");
            src_ip:                ternary @name("src_ip");
        }
        actions = { NoAction; }
        const default_action = NoAction();
        size = SERVICE_SOURCE_TABLE_SIZE;
    }

    apply {
        if (hdr.arp.isValid()) {
            arp_sender_mac = hdr.arp.sender_mac;
            src_ip = hdr.arp.sender_ip;
        } else if (hdr.ipv4.isValid()) {
            src_ip = hdr.ipv4.src_addr;
        }
        spoofed = service_sources.apply().hit;
    }
}

#endif  // _SOURCE_GUARD_P4_
