import Testing

@testable import RPCCore

@Suite struct MetadataTests {
    @Test func keysAreLowercasedAndOrdered() {
        var m = Metadata()
        m.add("X-A", "1")
        m.add("x-b-bin", binary: [0, 1])
        m.add("x-a", "2")
        #expect(m["x-a"] == "1")
        #expect(m.values("X-A").count == 2)
        #expect(m.binary("x-b-bin") == [0, 1])
        m.set("x-a", "3")
        #expect(m.values("x-a") == [.string("3")])
    }

    /// The header-block path: keys kept as given, in order, found like any other entry.
    @Test func lowercasedKeysFromHeaderBlocksAreKeptInOrder() {
        var m = Metadata()
        for i in 0..<6 { m.add(lowercased: "x-\(i)", .string("\(i)")) }
        m.add(lowercased: "x-b-bin", .binary([7]))
        #expect(m.entries.map(\.key) == ["x-0", "x-1", "x-2", "x-3", "x-4", "x-5", "x-b-bin"])
        #expect(m["X-5"] == "5")
        #expect(m.binary("x-b-bin") == [7])
        var expected = Metadata((0..<6).map { ("X-\($0)", "\($0)") })
        expected.add("x-b-bin", binary: [7])
        #expect(m == expected)
    }

    @Test func routerTellsUnknownServiceFromUnknownMethod() {
        struct S: RPCService {
            var serviceName: String { "a.v1.S" }
            var methods: [ServerMethod] {
                [ServerMethod(MethodDescriptor(service: "a.v1.S", method: "M", kind: .unary), .unary { b, _ in b })]
            }
        }
        let r = Router(services: [S()])
        if case .failure(let e) = r.lookup("/a.v1.S/X") { #expect(e.message.contains("Method not found")) } else { Issue.record("expected failure") }
        if case .failure(let e) = r.lookup("/a.v1.T/M") { #expect(e.message.contains("Service not found")) } else { Issue.record("expected failure") }
        if case .success(let m) = r.lookup("/a.v1.S/M") { #expect(m.descriptor.kind == .unary) } else { Issue.record("expected success") }
    }

    /// Trusted entries (sent without checks) keep their mark through appends, lose it through
    /// removals and filters, and are never confused with the client's entries around them.
    @Test func trustedEntriesAreMarkedByPosition() {
        var m = Metadata([("x-client", "a")])
        m.add(trusted: "x-forwarded-for", "127.0.0.1")
        m.add(lowercased: "x-other", .string("b"))
        #expect(!m.isTrusted(0) && m.isTrusted(1) && !m.isTrusted(2) && !m.isTrusted(64))
        #expect(m["x-forwarded-for"] == "127.0.0.1" && m.first(lowercased: "x-forwarded-for") == "127.0.0.1")
        #expect(m == Metadata([("x-client", "a"), ("x-forwarded-for", "127.0.0.1"), ("x-other", "b")]))

        var n = Metadata([("x-first", "1")])
        n.append(contentsOf: m)
        #expect(!n.isTrusted(0) && !n.isTrusted(1) && n.isTrusted(2) && !n.isTrusted(3))

        #expect(m.filter { _ in true }.trusted == 0)
        m.remove("x-client")
        #expect(m.trusted == 0 && m.count == 2)
        #expect(m.first(lowercased: "x-missing") == nil)
    }
}
