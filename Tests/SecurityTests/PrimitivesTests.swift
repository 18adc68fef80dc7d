import Foundation
import Testing

@testable import Security

func hex(_ s: String) -> [UInt8] {
    let clean = s.filter { !$0.isWhitespace }
    var out: [UInt8] = []
    var i = clean.startIndex
    while i < clean.endIndex {
        let j = clean.index(i, offsetBy: 2)
        out.append(UInt8(clean[i..<j], radix: 16)!)
        i = j
    }
    return out
}

func hexString(_ b: [UInt8]) -> String { b.map { String(format: "%02x", $0) }.joined() }

@Suite struct PrimitivesTests {
    @Test func base64urlMatchesRFC4648AndIsStrict() {
        let vectors: [(String, String)] = [
            ("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy"),
        ]
        for (plain, encoded) in vectors {
            #expect(Base64URL.encode(Array(plain.utf8)) == encoded)
            #expect(Base64URL.decode(encoded) == Array(plain.utf8))
        }
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
        for bad in ["Zg==", "Z", "Zh", "Zm9", "Zm+v", "Zm/v", "Zm9v ", "Zm.v", "é"] {
            #expect(Base64URL.decode(bad) == nil, "\(bad)")
        }
        for n in 0..<70 {
            let bytes = SecureRandom.bytes(n)
            #expect(Base64URL.decode(Base64URL.encode(bytes)) == bytes)
        }
    }

    @Test func secureRandomAndTokens() {
        #expect(SecureRandom.bytes(0).isEmpty)
        let a = SecureRandom.bytes(32), b = SecureRandom.bytes(32)
        #expect(a.count == 32 && a != b)
        let token = SecureRandom.token()
        #expect(token.count == 43)  // 32 bytes, unpadded
        #expect(token.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" })
        #expect(SecureRandom.token(bytes: 16).count == 22)
    }

    @Test func sha256AndHMACKnownAnswers() {
        #expect(hexString(SHA256.hash("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hexString(SHA256.hash([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        // RFC 4231 test case 2.
        let mac = HMACSHA256.authenticationCode(for: "what do ya want for nothing?", key: Array("Jefe".utf8))
        #expect(hexString(mac) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(HMACSHA256.isValid(mac, for: Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8)))
        #expect(!HMACSHA256.isValid(mac, for: Array("what do ya want for nothing!".utf8), key: Array("Jefe".utf8)))
        // Empty key and message are valid inputs (RFC 2104), not crashes.
        #expect(hexString(HMACSHA256.authenticationCode(for: [], key: [])) == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
    }

    @Test func constantTimeEquals() {
        #expect(ConstantTime.equals([], []))
        #expect(ConstantTime.equals([1, 2, 3], [1, 2, 3]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2, 4]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2]))
        // A difference at any place, in the words or in the tail, is found.
        let secret = (0..<77).map { UInt8(truncatingIfNeeded: $0 * 5 + 1) }  // two 32-byte steps, a word, a tail
        #expect(ConstantTime.equals(secret, secret))
        #expect(ConstantTime.equals(String(decoding: Array("per-call-gateway-token".utf8), as: UTF8.self), Array("per-call-gateway-token".utf8)))
        for at in secret.indices {
            for flip: UInt8 in [1, 0x80] {
                var other = secret
                other[at] ^= flip
                #expect(!ConstantTime.equals(secret, other), "byte \(at)")
            }
        }
    }
}
