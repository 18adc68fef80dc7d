import Foundation

/// Glicko-2 (Mark Glickman, "Example of the Glicko-2 system", 2013), as a pure function.
///
/// Each rated match is one rating period for both of its players, updated at the match's end with
/// that one result. Inactivity widens the deviation: every whole day since the player's last
/// rated match adds one idle period (φ² + σ² per period, step 6 of the paper) before the update,
/// capped at the starting deviation.
public enum Glicko2 {
    public static let startRating = 1500.0
    public static let startDeviation = 350.0
    public static let startVolatility = 0.06
    /// System constant τ (constrains volatility change; the paper's example uses 0.5).
    public static let tau = 0.5
    /// Convergence tolerance of the volatility iteration.
    static let epsilon = 0.000001
    /// 173.7178: the Glicko ↔ Glicko-2 scale.
    static let scale = 400.0 / log(10.0)
    /// Leaderboard rule: provisional while the deviation is above this or fewer than
    /// `provisionalMatches` rated matches were played.
    public static let provisionalDeviation = 110.0
    public static let provisionalMatches = 5

    public struct Rating: Sendable, Equatable {
        public var rating: Double
        public var deviation: Double
        public var volatility: Double
        public init(rating: Double = Glicko2.startRating, deviation: Double = Glicko2.startDeviation, volatility: Double = Glicko2.startVolatility) {
            self.rating = rating
            self.deviation = deviation
            self.volatility = volatility
        }
    }

    /// One game of the period: the opponent's rating before it, and the score (1 win, ½ draw, 0 loss).
    public struct Result: Sendable {
        public var opponent: Rating
        public var score: Double
        public init(opponent: Rating, score: Double) {
            self.opponent = opponent
            self.score = score
        }
    }

    public static func isProvisional(deviation: Double, ratedMatches: Int) -> Bool {
        deviation > provisionalDeviation || ratedMatches < provisionalMatches
    }

    /// The deviation after `periods` periods without games (step 6 alone), capped at 350.
    public static func idle(_ r: Rating, periods: Int) -> Rating {
        guard periods > 0 else { return r }
        let phi = r.deviation / scale
        let widened = (phi * phi + Double(periods) * r.volatility * r.volatility).squareRoot() * scale
        return Rating(rating: r.rating, deviation: min(startDeviation, widened), volatility: r.volatility)
    }

    /// The rating after one period with `results` (steps 2–8 of the paper). With no results only
    /// the deviation grows (step 6).
    public static func update(_ player: Rating, results: [Result]) -> Rating {
        let mu = (player.rating - startRating) / scale
        let phi = player.deviation / scale
        let sigma = player.volatility
        guard !results.isEmpty else {
            return Rating(rating: player.rating, deviation: min(startDeviation, (phi * phi + sigma * sigma).squareRoot() * scale), volatility: sigma)
        }
        func g(_ phi: Double) -> Double { 1 / (1 + 3 * phi * phi / (Double.pi * Double.pi)).squareRoot() }
        func e(_ mu: Double, _ muj: Double, _ phij: Double) -> Double { 1 / (1 + exp(-g(phij) * (mu - muj))) }

        // Step 3: estimated variance v; step 4: improvement Δ.
        var vInverse = 0.0, deltaSum = 0.0
        for r in results {
            let muj = (r.opponent.rating - startRating) / scale, phij = r.opponent.deviation / scale
            let gj = g(phij), ej = e(mu, muj, phij)
            vInverse += gj * gj * ej * (1 - ej)
            deltaSum += gj * (r.score - ej)
        }
        let v = 1 / vInverse
        let delta = v * deltaSum

        // Step 5: new volatility (Illinois algorithm).
        let a = log(sigma * sigma)
        func f(_ x: Double) -> Double {
            let ex = exp(x)
            let num = ex * (delta * delta - phi * phi - v - ex)
            let den = 2 * pow(phi * phi + v + ex, 2)
            return num / den - (x - a) / (tau * tau)
        }
        var A = a
        var B: Double
        if delta * delta > phi * phi + v {
            B = log(delta * delta - phi * phi - v)
        } else {
            var k = 1.0
            while f(a - k * tau) < 0 { k += 1 }
            B = a - k * tau
        }
        var fA = f(A), fB = f(B)
        var iterations = 0
        while abs(B - A) > epsilon && iterations < 1000 {
            let C = A + (A - B) * fA / (fB - fA)
            let fC = f(C)
            if fC * fB <= 0 {
                A = B
                fA = fB
            } else {
                fA /= 2
            }
            B = C
            fB = fC
            iterations += 1
        }
        let newSigma = exp(A / 2)

        // Steps 6–8.
        let phiStar = (phi * phi + newSigma * newSigma).squareRoot()
        let newPhi = 1 / (1 / (phiStar * phiStar) + 1 / v).squareRoot()
        let newMu = mu + newPhi * newPhi * deltaSum
        return Rating(rating: newMu * scale + startRating, deviation: min(startDeviation, newPhi * scale), volatility: newSigma)
    }
}
