import Contracts
import Foundation
import RPCCore

/// The team-task pages a browser opens (seed A UC8 and UC17), served by the gateway on its own
/// port and answered through the same relay as any call (the tasks RPCs are ACCESS_PUBLIC: the
/// token in the address or the form is the credential):
///
/// - `GET /t/<link token>`: the public view of a shared task (`GetPublicTeamTask`).
/// - `GET /upload` (optionally `?token=…`): the form to attach a file with an upload token.
/// - `POST /upload` (`multipart/form-data`: `token`, `file`): sends the file to the task
///   (`UploadTeamTaskAttachment`) and answers with a confirmation or a page saying what is wrong.
struct TaskPages: Sendable {
    /// Calls a unary method through the gateway's router and policy: (path, request bytes, the
    /// HTTP request it comes from) → response bytes.
    let call: @Sendable (String, [UInt8], HTTPRequest) async throws -> [UInt8]

    static let publicPath = "/tasks.v1.Tasks/GetPublicTeamTask"
    static let uploadPath = "/tasks.v1.Tasks/UploadTeamTaskAttachment"
    /// The largest file the form takes (the contract's 5 MiB).
    static let maxFileBytes = 5 * 1024 * 1024
    /// The largest form body read: a file somewhat over the limit is still read, so the answer can
    /// be a page saying the file is too large (larger bodies get the transport's plain 413).
    static let maxFormBytes = 8 * 1024 * 1024

    /// Whether `path` is one of these pages.
    static func serves(_ path: Substring) -> Bool { path == "/upload" || path.hasPrefix("/t/") }

    /// The body limit for a page request (asked at the request head).
    static func maxBodyBytes(method: String, path: Substring) -> Int? {
        if path == "/upload" { return method == "POST" ? maxFormBytes : 0 }
        if path.hasPrefix("/t/") { return 0 }
        return nil
    }

    func handle(_ request: HTTPRequest) async -> HTTPResponse {
        let path = request.path
        let get = request.method == "GET" || request.method == "HEAD"
        if path.hasPrefix("/t/") {
            guard get else { return Self.methodNotAllowed("GET") }
            return await publicTask(token: String(path.dropFirst(3)), request: request)
        }
        if get { return Self.uploadForm(token: Self.query(request.target, "token") ?? "") }
        guard request.method == "POST" else { return Self.methodNotAllowed("GET, POST") }
        return await upload(request)
    }

    // MARK: The public task page

    func publicTask(token: String, request: HTTPRequest) async -> HTTPResponse {
        // A token is 43 characters of base64url: anything else cannot be one.
        guard token.utf8.count == 43, token.utf8.allSatisfy({ Self.isBase64URL($0) }) else { return Self.linkNotFound() }
        var r = Tasks_V1_GetPublicTeamTaskRequest()
        r.linkToken = token
        let answer: Tasks_V1_GetPublicTeamTaskResponse
        do {
            answer = try Tasks_V1_GetPublicTeamTaskResponse(serializedBytes: try await call(Self.publicPath, r.serializedBytes(), request))
        } catch let e as RPCError {
            return e.code == .notFound ? Self.linkNotFound() : Self.failure(e)
        } catch {
            return Self.failure(RPCError(.internal, "internal error"))
        }
        let t = answer.task
        let done = t.status == .completed
        let percent = t.participantCount > 0 ? Int(t.completedCount) * 100 / Int(t.participantCount) : 0
        var body = "<div class=\"card\">"
        body += "<p class=\"muted\">Shared team task</p>"
        body += "<h1>\(HTMLPage.escape(t.name))</h1>"
        body += "<p><span class=\"status \(done ? "ok" : "open")\">\(done ? "Completed" : "In progress")</span> "
        body += "<strong>\(t.completedCount) of \(t.participantCount) done</strong></p>"
        body += "<progress value=\"\(t.completedCount)\" max=\"\(max(1, t.participantCount))\">\(percent)%</progress>"
        if !t.description_p.isEmpty { body += "<p>\(Self.paragraph(t.description_p))</p>" }
        if !t.participantNames.isEmpty {
            body += "<p class=\"muted\">Participants</p><ul>"
            for n in t.participantNames { body += "<li>\(HTMLPage.escape(n))</li>" }
            body += "</ul>"
        }
        if done, t.hasCompletedAt { body += "<p class=\"muted\">Completed on \(Self.date(t.completedAt.seconds)) (UTC)</p>" }
        body += "</div>"
        return HTMLPage.response(200, title: "\(t.name) · shared task", body: body)
    }

    static func linkNotFound() -> HTTPResponse {
        HTMLPage.response(
            404, title: "Link not found",
            body: """
                <div class="card"><h1>This link does not work</h1>
                <p>No task is shared under this link. It may have been revoked, or mistyped.</p>
                <p class="muted">Ask a participant of the task for a new link.</p></div>
                """)
    }

    // MARK: The upload form

    static func uploadForm(token: String, problem: String? = nil, status: Int = 200) -> HTTPResponse {
        var body = "<div class=\"card\"><h1>Attach a file to a task</h1>"
        if let problem { body += "<p><span class=\"status bad\">Not attached</span> \(HTMLPage.escape(problem))</p>" }
        body += """
            <p class="muted">Type the task token shown in the app (for example K7Q2-M9XD4), choose a file of at most 5 MiB, and send it.</p>
            <form method="post" action="/upload" enctype="multipart/form-data">
            <label for="token">Task token</label>
            <input type="text" id="token" name="token" value="\(HTMLPage.escape(token))" required autocomplete="off" autocapitalize="characters" spellcheck="false" maxlength="20" placeholder="XXXX-XXXXX">
            <label for="file">File</label>
            <input type="file" id="file" name="file" required>
            <button type="submit">Attach file</button>
            </form>
            <p class="muted">Accepted: PDF, images (PNG, JPEG, GIF, WEBP, HEIC), text, CSV, office documents, ZIP, audio and video.</p>
            </div>
            """
        return HTMLPage.response(status, title: "Attach a file", body: body)
    }

    func upload(_ request: HTTPRequest) async -> HTTPResponse {
        let parts: [Multipart.Part]
        do {
            let boundary = try Multipart.boundary(contentType: request.header("content-type") ?? "")
            parts = try Multipart.parse(request.body, boundary: boundary)
        } catch {
            return Self.uploadForm(token: "", problem: "The form could not be read. Please choose the file again and send it.", status: 400)
        }
        let token = String(decoding: parts.first { $0.name == "token" }?.body ?? [], as: UTF8.self).strip(" \t\r\n")
        guard let file = parts.first(where: { $0.name == "file" }), let rawName = file.filename, !rawName.isEmpty else {
            return Self.uploadForm(token: token, problem: "Choose a file to attach.", status: 400)
        }
        guard !token.isEmpty else { return Self.uploadForm(token: "", problem: "Type the task token shown in the app.", status: 400) }
        if file.body.count > Self.maxFileBytes {
            return Self.uploadForm(
                token: token, problem: "The file is \(Self.size(file.body.count)); files of at most 5 MiB can be attached.", status: 413)
        }
        if file.body.isEmpty { return Self.uploadForm(token: token, problem: "The file is empty.", status: 400) }
        var r = Tasks_V1_UploadTeamTaskAttachmentRequest()
        r.uploadToken = token
        r.filename = Self.baseName(rawName)
        r.contentType = file.contentType ?? ""
        r.data = file.body
        let answer: Tasks_V1_UploadTeamTaskAttachmentResponse
        do {
            answer = try Tasks_V1_UploadTeamTaskAttachmentResponse(serializedBytes: try await call(Self.uploadPath, r.serializedBytes(), request))
        } catch let e as RPCError {
            switch e.code {
            case .notFound:
                let expired = e.message.contains("expired")
                return Self.uploadForm(
                    token: token,
                    problem: expired
                        ? "This task token has expired (tokens last 24 hours). Ask for a new token in the app."
                        : "No task has this token. Check the characters, or ask for a new token in the app.",
                    status: 404)
            case .invalidArgument:
                return Self.uploadForm(token: token, problem: "The file cannot be attached: \(Self.reasons(e.message)).", status: 400)
            case .resourceExhausted:
                var r = Self.uploadForm(token: token, problem: Self.sentence(e.message), status: 429)
                r.headers.append(contentsOf: ConnectHandler.limitHeaders(e))
                return r
            default:
                return Self.failure(e)
            }
        } catch {
            return Self.failure(RPCError(.internal, "internal error"))
        }
        let a = answer.attachment
        let body = """
            <div class="card"><p><span class="status ok">Attached</span></p>
            <h1>\(HTMLPage.escape(a.filename))</h1>
            <p>is now attached to <strong>\(HTMLPage.escape(answer.taskName))</strong>.</p>
            <dl><dt>Size</dt><dd>\(Self.size(Int(a.sizeBytes)))</dd><dt>Type</dt><dd>\(HTMLPage.escape(a.contentType))</dd>
            <dt>SHA-256</dt><dd>\(HTMLPage.escape(a.sha256))</dd></dl>
            <p class="muted">The participants of the task can open it in the app.</p>
            <footer><a href="/upload?token=\(Self.percentEncode(token))">Attach another file</a></footer></div>
            """
        return HTMLPage.response(200, title: "File attached", body: body)
    }

    // MARK: Helpers

    /// A page for a failure that is not the visitor's (the service cannot be reached, …).
    static func failure(_ e: RPCError) -> HTTPResponse {
        let status = e.code == .unavailable || e.code == .deadlineExceeded ? 503 : e.code == .resourceExhausted ? 429 : 500
        var r = HTMLPage.response(
            status, title: "Try again later",
            body: """
                <div class="card"><h1>Something went wrong</h1>
                <p>The page cannot be shown right now. Please try again in a moment.</p></div>
                """)
        r.headers.append(contentsOf: ConnectHandler.limitHeaders(e))
        return r
    }

    static func methodNotAllowed(_ allow: String) -> HTTPResponse {
        var r = HTMLPage.response(405, title: "Not allowed", body: "<div class=\"card\"><h1>Not allowed</h1></div>")
        r.headers.append(("allow", allow))
        return r
    }

    /// The field problems of an INVALID_ARGUMENT message ("invalid request: data: …; filename: …").
    static func reasons(_ message: String) -> String {
        let text = message.split(separator: ":", maxSplits: 1).dropFirst().first.map { String($0) } ?? message
        return text.strip(" ")
    }

    static func sentence(_ s: String) -> String {
        guard let f = s.first else { return s }
        return f.uppercased() + s.dropFirst() + (s.hasSuffix(".") ? "" : ".")
    }

    /// A file name without any directory a browser may have sent (old browsers send full paths).
    static func baseName(_ name: String) -> String {
        let last = name.split(whereSeparator: { $0 == "/" || $0 == "\\" }).last.map(String.init) ?? ""
        return last.isEmpty ? "file" : last
    }

    static func size(_ n: Int) -> String {
        if n < 1024 { return "\(n) bytes" }
        if n < 1024 * 1024 { return String(format: "%.1f KiB", Double(n) / 1024) }
        return String(format: "%.1f MiB", Double(n) / 1024 / 1024)
    }

    static func date(_ seconds: Int64) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withFullDate]
        f.timeZone = TimeZone(identifier: "UTC")
        return f.string(from: Date(timeIntervalSince1970: TimeInterval(seconds)))
    }

    /// Escaped text with its line breaks kept.
    static func paragraph(_ s: String) -> String {
        HTMLPage.escape(s).replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\n", with: "<br>")
    }

    static func isBase64URL(_ c: UInt8) -> Bool {
        (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || (0x30...0x39).contains(c) || c == 0x2D || c == 0x5F
    }

    static func percentEncode(_ s: String) -> String {
        var out = ""
        for b in s.utf8 {
            if (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b) || (0x30...0x39).contains(b) || b == 0x2D || b == 0x5F || b == 0x2E {
                out.unicodeScalars.append(Unicode.Scalar(b))
            } else {
                out += String(format: "%%%02X", b)
            }
        }
        return out
    }

    /// A query parameter's value (percent-decoded, `+` as space), if present.
    static func query(_ target: String, _ name: String) -> String? {
        guard let q = target.split(separator: "?", maxSplits: 1).dropFirst().first else { return nil }
        for pair in q.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard kv.count == 2, kv[0] == name else { continue }
            return String(kv[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding
        }
        return nil
    }
}
