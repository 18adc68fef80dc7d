import RPCCore
import RPCTransport
import Security

/// The gateway's plain web pages (docs/gateway.md, "Web pages"): server-rendered HTML with one
/// inline style sheet and no script, every piece of user text escaped. Each page is answered with
/// headers that keep a browser from doing anything the page does not need: the style sheet by its
/// hash and nothing else (Content-Security-Policy), no sniffing, no framing, no referrer (token
/// pages carry the token in their address), no caching of pages about a token.
public enum HTMLPage {
    /// Text for an HTML text node or a double-quoted attribute value.
    public static func escape(_ s: String) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for c in s.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            case "\u{0}": out += "\u{FFFD}"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }

    /// The one style sheet of every page (inline; allowed by its hash in the CSP).
    static let style = """
        body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f4f5f7;color:#1d2330;line-height:1.45}
        main{max-width:34rem;margin:0 auto;padding:1.25rem}
        .card{background:#fff;border-radius:12px;padding:1.25rem 1.5rem;box-shadow:0 1px 3px rgba(0,0,0,.12)}
        h1{font-size:1.35rem;margin:.2rem 0 .8rem}
        p{margin:.5rem 0}
        label{display:block;font-weight:600;margin:1rem 0 .35rem}
        input[type=text]{font-size:1.2rem;padding:.55rem .7rem;width:100%;box-sizing:border-box;border:1px solid #b8bfcc;border-radius:8px;letter-spacing:.08em;text-transform:uppercase}
        input[type=file]{font-size:1rem;width:100%}
        button{margin-top:1.25rem;font-size:1.05rem;padding:.65rem 1.4rem;border:0;border-radius:8px;background:#2f6fde;color:#fff;cursor:pointer}
        .muted{color:#5b6475;font-size:.92rem}
        .status{display:inline-block;padding:.15rem .6rem;border-radius:999px;font-size:.85rem;font-weight:600}
        .ok{background:#dff5e3;color:#1b6b2e}.open{background:#fff1d6;color:#7a5200}.bad{background:#fde2e1;color:#9b1c1c}
        ul{padding-left:1.2rem}
        progress{width:100%;height:12px;margin:.4rem 0 1rem;accent-color:#2f9e55}
        dl{display:grid;grid-template-columns:auto 1fr;gap:.25rem .9rem;margin:.8rem 0}dt{color:#5b6475}dd{margin:0;word-break:break-all}
        footer{margin-top:1rem;text-align:center}
        main.wide{max-width:72rem}
        .grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,20rem),1fr));gap:1rem;margin:1rem 0}
        .svc h2{font-size:1.15rem;margin:0 0 .5rem;display:flex;justify-content:space-between;align-items:center;gap:.5rem}
        .svc dl{margin:.4rem 0}.svc dd{word-break:normal;overflow-wrap:anywhere}
        .warn{color:#8a5a00;font-weight:600}.err{color:#9b1c1c;font-weight:600}.nw{white-space:nowrap}
        table{border-collapse:collapse;width:100%;font-size:.9rem;margin-top:.6rem}
        th,td{text-align:left;padding:.25rem .4rem;border-bottom:1px solid #e4e7ec}td{overflow-wrap:anywhere}
        th{color:#5b6475;font-weight:600;white-space:nowrap}.n{text-align:right;white-space:nowrap}
        @media (max-width:400px){main.wide{padding:.75rem}main.wide .card{padding:1rem}main.wide table{font-size:.82rem}main.wide th,main.wide td{padding:.2rem .25rem}}
        """

    /// `'sha256-…'` of the style sheet, for the CSP.
    static let styleHash = "'sha256-" + Base64.encode(SHA256.hash(Array(style.utf8))) + "'"

    /// The Content-Security-Policy of every page: nothing but the style sheet, forms posting back
    /// here only, never framed.
    static let contentSecurityPolicy =
        "default-src 'none'; style-src \(styleHash); img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

    /// A whole page: `body` is HTML the caller built (with every user text through `escape`);
    /// `head`, more elements for the head (a refresh); `wide`, a page for wide tables and grids.
    public static func render(title: String, body: String, head: String = "", wide: Bool = false) -> String {
        """
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="referrer" content="no-referrer">
        <title>\(escape(title))</title>
        <style>\(style)</style>\(head)
        </head>
        <body><main\(wide ? " class=\"wide\"" : "")>
        \(body)
        </main></body>
        </html>

        """
    }

    /// The response for a page: HTML with the protective headers; `cache: false` for pages about
    /// a token or a result (never stored by the browser or a proxy).
    public static func response(
        _ status: Int, title: String, body: String, cache: Bool = false, head: String = "", wide: Bool = false
    ) -> HTTPResponse {
        var headers: [(name: String, value: String)] = [
            ("content-type", "text/html; charset=utf-8"),
            ("x-content-type-options", "nosniff"),
            ("content-security-policy", contentSecurityPolicy),
            ("x-frame-options", "DENY"),
            ("referrer-policy", "no-referrer"),
            ("cross-origin-opener-policy", "same-origin"),
        ]
        headers.append(("cache-control", cache ? "public, max-age=300" : "no-store"))
        return HTTPResponse(status: status, headers: headers, body: Array(render(title: title, body: body, head: head, wide: wide).utf8))
    }
}
