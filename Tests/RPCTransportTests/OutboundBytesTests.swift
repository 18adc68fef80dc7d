import NIOCore
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
        for length in [1, 7, 8, 9, 16, 23] {
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
