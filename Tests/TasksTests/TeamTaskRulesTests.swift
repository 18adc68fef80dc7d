import Testing

@testable import Tasks

/// Team-task rules without storage: token shapes, attachment types and names.
@Suite("Tasks: team-task rules (pure)")
struct TeamTaskRulesTests {
    @Test func uploadTokensArePersonTypable() {
        var seen = Set<String>()
        for _ in 0..<2000 {
            let t = TeamTaskRules.newUploadToken()
            #expect(t.count == 10 && Array(t)[4] == "-")
            #expect(TeamTaskRules.normalizeUploadToken(t) == t.replacingOccurrences(of: "-", with: ""))
            seen.insert(t)
        }
        #expect(seen.count > 1990)
        #expect(TeamTaskRules.normalizeUploadToken("k7q2-m9xd4") == "K7Q2M9XD4")
        #expect(TeamTaskRules.normalizeUploadToken(" K7Q2 M9XD4 ") == "K7Q2M9XD4")
        #expect(TeamTaskRules.normalizeUploadToken("O1IL-00000") == "01110" + "0000")
        #expect(TeamTaskRules.normalizeUploadToken("K7Q2-M9XD") == nil)
        #expect(TeamTaskRules.normalizeUploadToken("K7Q2-M9XD44") == nil)
        #expect(TeamTaskRules.normalizeUploadToken("K7Q2-M9XU4") == nil)  // U is not in the alphabet
        #expect(TeamTaskRules.normalizeUploadToken("<script>") == nil)
        #expect(TeamTaskRules.uploadTokenHash("K7Q2M9XD4") != TeamTaskRules.uploadTokenHash("K7Q2M9XD5"))
    }

    @Test func linkTokensAre43Base64URLCharacters() {
        let t = TeamTaskRules.newLinkToken()
        #expect(t.count == 43 && TeamTaskRules.isLinkToken(t))
        #expect(TeamTaskRules.newLinkToken() != t)
        #expect(!TeamTaskRules.isLinkToken(String(t.dropLast()) + "/"))
        #expect(!TeamTaskRules.isLinkToken("short"))
    }

    @Test func contentTypesAreAllowedAndCheckedAgainstTheBytes() throws {
        let pdf = Array("%PDF-1.7 ...".utf8)
        #expect(try TeamTaskRules.contentType("application/pdf", data: pdf).get() == "application/pdf")
        #expect(try TeamTaskRules.contentType("Application/PDF; charset=binary", data: pdf).get() == "application/pdf")
        #expect(try TeamTaskRules.contentType("", data: [1, 2]).get() == "application/octet-stream")
        #expect(try TeamTaskRules.contentType("text/plain", data: Array("hi".utf8)).get() == "text/plain")
        #expect(try TeamTaskRules.contentType("image/png", data: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0]).get() == "image/png")
        for refused in ["text/html", "image/svg+xml", "application/javascript", "application/xhtml+xml", "text/xml", "nonsense", "a/"] {
            if case .success = TeamTaskRules.contentType(refused, data: [1]) { Issue.record("\(refused) accepted") }
        }
        // Declared PDF/PNG/JPEG/GIF/ZIP/WEBP must start like one.
        for (t, bytes) in [("application/pdf", Array("<html>".utf8)), ("image/png", [0xFF, 0xD8, 0xFF]), ("image/webp", Array("RIFF....WEBX".utf8))] {
            if case .success = TeamTaskRules.contentType(t, data: bytes) { Issue.record("\(t) with other bytes accepted") }
        }
        if case .success = TeamTaskRules.contentType(String(repeating: "a", count: 101), data: [1]) { Issue.record("101 characters accepted") }
    }

    @Test func filenames() {
        #expect(TeamTaskRules.filenameProblem("notes.pdf") == nil)
        #expect(TeamTaskRules.filenameProblem("Compte rendu – été 2025 ✓.docx") == nil)
        #expect(TeamTaskRules.filenameProblem("<img src=x onerror=alert(1)>.png") == nil)  // allowed, escaped wherever shown
        #expect(TeamTaskRules.filenameProblem("") != nil)
        #expect(TeamTaskRules.filenameProblem("a/b") != nil)
        #expect(TeamTaskRules.filenameProblem("a\\b") != nil)
        #expect(TeamTaskRules.filenameProblem("..") != nil)
        #expect(TeamTaskRules.filenameProblem("a\nb") != nil)
        #expect(TeamTaskRules.filenameProblem(String(repeating: "x", count: 256)) != nil)
        #expect(TeamTaskRules.filenameProblem(String(repeating: "é", count: 255)) == nil)
    }
}
