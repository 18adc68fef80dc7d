import Foundation
import RPCCore
import Testing

@testable import Gateway

/// The gateway's page module on its own: escaping, headers, the multipart parser.
@Suite struct PagesTests {
    @Test func escapesEverythingThatCouldBecomeMarkup() {
        #expect(HTMLPage.escape(#"<script>alert("x")</script> & 'y'"#) == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;")
        #expect(HTMLPage.escape("a\u{0}b") == "a\u{FFFD}b")
        #expect(HTMLPage.escape("Ünïcödé ✓") == "Ünïcödé ✓")
    }

    @Test func everyPageHasItsProtectiveHeaders() {
        let r = HTMLPage.response(200, title: "<t>", body: "<p>x</p>")
        let h = Dictionary(r.headers.map { ($0.name, $0.value) }, uniquingKeysWith: { a, _ in a })
        #expect(h["content-type"] == "text/html; charset=utf-8")
        #expect(h["x-content-type-options"] == "nosniff")
        #expect(h["cache-control"] == "no-store")
        #expect(h["referrer-policy"] == "no-referrer")
        let csp = h["content-security-policy"] ?? ""
        #expect(csp.hasPrefix("default-src 'none'") && csp.contains("style-src 'sha256-") && !csp.contains("unsafe") && !csp.contains("script-src"))
        let html = String(decoding: r.body, as: UTF8.self)
        #expect(html.contains("<title>&lt;t&gt;</title>") && html.contains("<meta charset=\"utf-8\">"))
    }

    func form(_ boundary: String, _ parts: [(String, String?, String?, [UInt8])]) -> [UInt8] {
        var out: [UInt8] = []
        for (name, filename, type, body) in parts {
            var head = "--\(boundary)\r\nContent-Disposition: form-data; name=\"\(name)\""
            if let filename { head += "; filename=\"\(filename)\"" }
            head += "\r\n"
            if let type { head += "Content-Type: \(type)\r\n" }
            head += "\r\n"
            out += Array(head.utf8) + body + Array("\r\n".utf8)
        }
        return out + Array("--\(boundary)--\r\n".utf8)
    }

    @Test func parsesWhatBrowsersSend() throws {
        let b = "----WebKitFormBoundaryq8XxM2aLp9Z"
        #expect(try Multipart.boundary(contentType: "multipart/form-data; boundary=\(b)") == b)
        #expect(try Multipart.boundary(contentType: "Multipart/Form-Data; charset=utf-8; boundary=\"abc def\"") == "abc def")
        #expect(throws: Multipart.Failure.notMultipart) { try Multipart.boundary(contentType: "application/json") }
        #expect(throws: Multipart.Failure.noBoundary) { try Multipart.boundary(contentType: "multipart/form-data") }

        // A file whose bytes contain CRLF, dashes and something like the boundary's start.
        let file: [UInt8] = Array("%PDF-1.7\r\n--\r\n----WebKit".utf8) + [0, 255, 13, 10]
        let parsed = try Multipart.parse(
            form(b, [("token", nil, nil, Array("k7q2-m9xd4".utf8)), ("file", #"a \"quoted\" <name>.pdf"#, "application/pdf", file)]), boundary: b)
        #expect(parsed.count == 2)
        #expect(parsed[0].name == "token" && parsed[0].filename == nil && parsed[0].body == Array("k7q2-m9xd4".utf8))
        #expect(parsed[1].name == "file" && parsed[1].filename == #"a "quoted" <name>.pdf"# && parsed[1].contentType == "application/pdf")
        #expect(parsed[1].body == file)
        // A file input with nothing chosen: an empty file name and no bytes.
        let empty = try Multipart.parse(form(b, [("file", "", "application/octet-stream", [])]), boundary: b)
        #expect(empty[0].filename == "" && empty[0].body.isEmpty)
    }

    @Test func refusesMalformedForms() {
        let b = "XyZ"
        for bad in [
            Array("no boundary here".utf8),
            Array("--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nunterminated".utf8),
            Array("--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--".utf8),  // no Content-Disposition
            Array("--XyZgarbage".utf8),
            Array(("--XyZ\r\n" + String(repeating: "h", count: 9000) + "\r\n\r\nx\r\n--XyZ--").utf8),
        ] {
            #expect(throws: Multipart.Failure.self) { try Multipart.parse(bad, boundary: b) }
        }
        let many = form(b, (0..<20).map { ("f\($0)", nil, nil, [1]) })
        #expect(throws: Multipart.Failure.self) { try Multipart.parse(many, boundary: b) }
    }

    @Test func pageHelpers() {
        #expect(TaskPages.baseName(#"C:\Users\me\Desktop\report.pdf"#) == "report.pdf")
        #expect(TaskPages.baseName("/home/me/a.txt") == "a.txt")
        #expect(TaskPages.baseName("/") == "file")
        #expect(TaskPages.query("/upload?x=1&token=K7Q2-M9XD4", "token") == "K7Q2-M9XD4")
        #expect(TaskPages.query("/upload?token=a%20b+c", "token") == "a b c")
        #expect(TaskPages.query("/upload", "token") == nil)
        #expect(TaskPages.percentEncode("K7Q2 M9XD4&x") == "K7Q2%20M9XD4%26x")
        #expect(TaskPages.maxBodyBytes(method: "POST", path: "/upload") == 8 * 1024 * 1024)
        #expect(TaskPages.maxBodyBytes(method: "GET", path: "/t/abc") == 0)
        #expect(TaskPages.serves("/t/x") && TaskPages.serves("/upload") && !TaskPages.serves("/tasks.v1.Tasks/GetTeamTask"))
    }
}
