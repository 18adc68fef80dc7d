import NIOCore
import RPCCore
import Testing

@testable import RPCTransport

@Suite struct OutboundBytesTests {
    /// What nghttp2 would pull, `chunk` bytes at a time.
    static func drain(_ o: inout OutboundBytes, chunk: Int) -> [UInt8] {
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: chunk)
        while o.readableBytes > 0 {
            let before = o.readableBytes
            let n = buf.withUnsafeMutableBufferPointer { o.read(into: $0.baseAddress!, max: chunk) }
            #expect(n > 0 && o.readableBytes == before - n)
            out += buf[..<n]
        }
        return out
    }

    /// The same bytes as framing every message into a buffer, whatever the reads' sizes.
    @Test(arguments: [1, 2, 4, 5, 6, 7, 300, 70_000])
    func framesAsTheBufferWould(chunk: Int) {
        let first = (0..<300).map { UInt8(truncatingIfNeeded: $0 * 7) }
        let second: [UInt8] = Array("second".utf8)
        let big = [UInt8](repeating: 0xAB, count: 66_000)
        var reference = ByteBuffer()
        var o = OutboundBytes()
        for m in [first, second, [], big] {
            reference.writeGRPCMessage(m, compress: false)
            o.writeMessage(m, compress: false)
        }
        reference.writeBytes([1, 2, 3])
        o.writeBytes([1, 2, 3])
        #expect(o.readableBytes == reference.readableBytes)
        #expect(Self.drain(&o, chunk: chunk) == Array(reference.readableBytesView))
        // Empty again: the next message is kept as an array again and read as framed.
        o.writeMessage([], compress: false)
        #expect(Self.drain(&o, chunk: chunk) == [0, 0, 0, 0, 0])
        o.writeMessage(second, compress: false)
        #expect(Self.drain(&o, chunk: chunk) == [0, 0, 0, 0, 6] + second)
    }
}

@Suite struct HeaderBlockCheckTests {
    @Test func namesAndValuesAreCheckedWholly() {
        #expect(HeaderBlock.isValidName("x-gateway-token"))
        #expect(HeaderBlock.isValidName("a.b_c-9"))
        #expect(!HeaderBlock.isValidName(""))
        #expect(!HeaderBlock.isValidName("X-Upper"))
        #expect(!HeaderBlock.isValidName(String(repeating: "a", count: 300) + " "))
        let token = "Bearer " + String(repeating: "abcDEF123-_.", count: 30)
        #expect(HeaderBlock.sanitize(token) == token)
        // A bad byte anywhere, even past the first vector's worth, is replaced.
        #expect(HeaderBlock.sanitize(token + "\n") == token + "?")
        #expect(HeaderBlock.sanitize("é") == "??")
        #expect(HeaderBlock.sanitize(String(repeating: "a", count: 100) + "\u{7F}" + "b") == String(repeating: "a", count: 100) + "?b")
    }

    /// The word-at-a-time check against the byte-by-byte rule: every byte value, at every place
    /// in a word and in the tail, among printable neighbours of every kind at the edges.
    @Test func theWordAtATimeCheckAgreesWithTheByteRule() {
        for length in [1, 7, 8, 9, 16, 23, 32, 41, 71] {
            for at in 0..<length {
                for neighbour in [UInt8(0x20), 0x7E, 0x41] {
                    for byte in 0...255 {
                        var bytes = [UInt8](repeating: neighbour, count: length)
                        bytes[at] = UInt8(byte)
                        let expected = bytes.allSatisfy { $0 >= 0x20 && $0 <= 0x7E }
                        let got = bytes.withUnsafeBufferPointer { HeaderBlock.allPrintable($0) }
                        #expect(got == expected, "byte \(byte) at \(at) of \(length)")
                    }
                }
            }
        }
        #expect([UInt8]().withUnsafeBufferPointer { HeaderBlock.allPrintable($0) })
    }
}

@Suite struct MetadataBytesTests {
    static func bytes(_ pairs: [(String, String)]) -> MetadataBytes {
        var m = MetadataBytes()
        for (n, v) in pairs {
            Array(n.utf8).withUnsafeBytes { name in Array(v.utf8).withUnsafeBytes { value in m.append(name: name, value: value) } }
        }
        return m
    }

    static func pairs(_ block: HeaderBlock) -> [String] { block.pairs.map { "\($0.name): \($0.value)" } }

    @Test func cleanMetadataGoesIntoABlockAsItIs() {
        let token = "Bearer " + String(repeating: "abcDEF123-_.", count: 30)
        var m = Self.bytes([("authorization", token), ("x-a", "1"), ("x-blob-bin", "AAEC+g")])
        m.append(trusted: "x-forwarded-for", "10.0.0.7")
        #expect(m.isClean && m.count == 4)
        var block = HeaderBlock()
        block.add(":path", "/p")
        block.append(m)
        #expect(block.count == 5)
        #expect(Self.pairs(block) == [":path: /p", "authorization: \(token)", "x-a: 1", "x-blob-bin: AAEC+g", "x-forwarded-for: 10.0.0.7"])
        #expect(CredentialCheck.bearerTokenRange(m) == 7..<token.utf8.count)
        #expect(m.withFirstValue(of: "x-a") { $0.map { String(decoding: $0, as: UTF8.self) } } == "1")
        #expect(m.withFirstValue(of: "x-absent") { $0 == nil })
    }

    /// What HTTP allows and gRPC does not goes entry by entry, under `add(metadata:)`'s rule.
    @Test func metadataThatIsNotCleanIsSentByTheMetadataRule() {
        let m = Self.bytes([("x-ok", "1"), ("x-tab", "a\tb"), ("x-obs", "caf\u{e9}"), ("x-na!me", "2"), ("te", "trailers"), ("x-z", "3")])
        #expect(!m.isClean && m.count == 6)
        var block = HeaderBlock()
        block.append(m)
        #expect(Self.pairs(block) == ["x-ok: 1", "x-tab: a?b", "x-obs: caf??", "x-z: 3"])
        // Each way of being unclean on its own.
        #expect(!Self.bytes([("x-a", "\u{7F}")]).isClean)
        #expect(!Self.bytes([("X-Up", "1")]).isClean)
        #expect(!Self.bytes([("content-type", "application/grpc")]).isClean)
        #expect(Self.bytes([("x-a", " spaced ~")]).isClean)
    }

    @Test func filteringKeepsOrderAndCleanliness() {
        let m = Self.bytes([("x-forwarded-for", "6.6.6.6"), ("authorization", "Bearer t"), ("x-user-id", "root"), ("x-b", "2")])
        #expect(m.contains(name: { $0.first == UInt8(ascii: "x") }))
        let kept = m.filter(name: { $0.first != UInt8(ascii: "x") || $0.count == 3 })
        var block = HeaderBlock()
        block.append(kept)
        #expect(Self.pairs(block) == ["authorization: Bearer t", "x-b: 2"])
        #expect(kept.isClean)
        #expect(MetadataBytes().isEmpty && !MetadataBytes().contains(name: { _ in true }))
    }

    @Test func bearerTokensAreFoundInTheBytesAsInStrings() {
        for value in ["Bearer abc", "bearer   abc  ", "BEARER abc", "Bearer ", "Basic abc", "Bearerabc", "Bearer    ", ""] {
            let m = Self.bytes([("authorization", value)])
            let fromBytes = m.withFirstValue(of: "authorization") { v in
                v.flatMap { CredentialCheck.bearerTokenRange($0).map { String(decoding: UnsafeRawBufferPointer(rebasing: v![$0]), as: UTF8.self) } }
            }
            var metadata = Metadata()
            metadata.add("authorization", value)
            #expect(fromBytes == CredentialCheck.bearerToken(metadata).map(String.init), "\(value)")
        }
    }
}
