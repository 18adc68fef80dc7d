import Observability
import RPCCore

/// Which request headers reach the services and which the gateway sets itself.
///
/// Services trust a few headers only when the call carries the gateway's credential
/// (`x-gateway-token`), which the gateway adds: the client's address (`x-forwarded-for`) and,
/// in general, anything naming an identity. A client must never be able to set those, so every
/// reserved name (credentials included) is removed from what the client sent before the gateway
/// adds its own values. The caller's `authorization` passes unchanged: each service verifies
/// the token again.
public enum HeaderPolicy {
    /// Names removed from client requests.
    public static let strippedNames: Set<String> = [
        "x-service-token", "x-gateway-token", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip",
        "forwarded", "x-user-id", "x-session-id", "x-caller", "x-caller-id", "x-client-address",
    ]
    /// Prefixes removed from client requests (`x-identity-user`, `x-internal-debug`, ...).
    public static let strippedPrefixes: [String] = ["x-identity", "x-internal-", "x-gateway-", "x-service-", "x-user-"]

    public static func isStripped(_ key: String) -> Bool {
        // Every reserved name but `forwarded` starts with "x-": most keys leave here.
        guard key.utf8.first == UInt8(ascii: "x") || key == "forwarded" else { return false }
        if strippedNames.contains(key) { return true }
        for p in strippedPrefixes where key.hasPrefix(p) { return true }
        return false
    }

    /// `isStripped` for a name as its header block carried it (every reserved name starts with
    /// `x` or `f`: most names leave at their first byte, without a string).
    public static func isStripped(_ name: UnsafeRawBufferPointer) -> Bool {
        guard let first = name.first, first == UInt8(ascii: "x") || first == UInt8(ascii: "f") else { return false }
        return isStripped(String(decoding: name, as: UTF8.self))
    }

    /// The client's metadata as the relay passes it on (as its header block carried it): as it
    /// is, or, when it has a reserved name, a copy without them.
    public static func forwarded(_ client: MetadataBytes) -> MetadataBytes {
        client.contains(name: { isStripped($0) }) ? client.filter(name: { !isStripped($0) }) : client
    }

    /// What the relay adds to the client's metadata: the client's address (made once per client
    /// connection).
    public static func added(clientAddress: String) -> MetadataBytes {
        var m = MetadataBytes()
        m.append(trusted: "x-forwarded-for", clientAddress)
        return m
    }

    /// The metadata an upstream call carries: the client's, minus reserved names, plus the
    /// client's address; with `trace` (the gateway's span), the client's `traceparent` and
    /// `tracestate` give way to the span's, in the same single pass and allocation. (The gateway's
    /// credential is the upstream channel's own metadata: `ChannelConfiguration.metadata`.)
    public static func upstreamMetadata(_ client: Metadata, clientAddress: String, trace: TraceContext? = nil) -> Metadata {
        let replacesTrace = trace != nil
        var out = client.filter(reservingExtra: replacesTrace ? 3 : 1) {
            !isStripped($0) && !(replacesTrace && ($0 == "traceparent" || $0 == "tracestate"))
        }
        // The gateway's own values go as trusted entries (the transport does not check them again
        // on every call): an address from the socket, a traceparent the gateway formatted.
        out.add(trusted: "x-forwarded-for", clientAddress)
        if let trace {
            out.add(trusted: "traceparent", trace.traceparent)
            if let state = trace.traceState { out.add(lowercased: "tracestate", .string(state)) }
        }
        return out
    }
}
