//! Route templates (`GET /users/{id}`) to the route names scopes carry.
//!
//! A scope name must never hold a raw path: ids would make every request a
//! scope of its own, no budget would be shared, and the coordinator's
//! scope table would grow with traffic. So a request is named by the first
//! template that matches it, and a request no template matches by the
//! **fallback** `"{METHOD} other"`: one name per standard method, and
//! `"OTHER other"` for any extension method. A listener therefore names at
//! most `templates + 10` routes, whatever its traffic.

use serde::Deserialize;
use tollgate_client::Priority;

/// Templates one listener may hold.
pub const MAX_ROUTES: usize = 1024;
/// The longest template.
pub const MAX_TEMPLATE: usize = 256;
/// Path segments a template may have.
pub const MAX_SEGMENTS: usize = 32;

// ---- a route as the file writes it (the config reads it, this compiles it)

/// How a route may be repeated, when the method's rule is not right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Repeat {
    /// By the method (idempotent methods are safe) and `Idempotency-Key`.
    Method,
    /// Always safe to repeat (a POST that is really a query).
    Safe,
    /// Never repeated, whatever the method or key.
    Never,
}

/// One `[[listener.route]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    pub(super) route: String,
    pub(super) priority: Option<PriorityName>,
    pub(super) repeat: Option<Repeat>,
}

/// A priority class as the file and the `tollgate-priority` header name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum PriorityName {
    Critical,
    Normal,
    Bulk,
}

impl PriorityName {
    pub(super) fn priority(self) -> Priority {
        match self {
            PriorityName::Critical => Priority::Critical,
            PriorityName::Normal => Priority::Normal,
            PriorityName::Bulk => Priority::Bulk,
        }
    }
}

/// The route of a request no template matches (after the method).
pub const FALLBACK: &str = "other";

/// A template the file got wrong: its index and why.
#[derive(Debug)]
pub(super) struct RouteError {
    pub(super) index: usize,
    pub(super) reason: String,
}

/// What a template says about the requests it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch<'t> {
    /// The scope's route name: the template as written, or the fallback.
    pub name: &'t str,
    /// The template's priority class, if it sets one.
    pub priority: Option<Priority>,
    /// The template's repetition rule.
    pub repeat: Repeat,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    /// `{name}`: any one non-empty segment.
    Any,
}

#[derive(Debug, Clone)]
struct Template {
    name: String,
    method: http::Method,
    segments: Vec<Segment>,
    priority: Option<Priority>,
    repeat: Repeat,
}

/// A listener's templates, matched in the order written.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    templates: Vec<Template>,
    /// `"GET other"`, … built once: a match hands out a borrowed name.
    fallbacks: Vec<(http::Method, String)>,
    fallback_other: String,
}

/// The methods with a fallback name of their own.
const STANDARD: [http::Method; 9] = [
    http::Method::GET,
    http::Method::HEAD,
    http::Method::POST,
    http::Method::PUT,
    http::Method::DELETE,
    http::Method::PATCH,
    http::Method::OPTIONS,
    http::Method::TRACE,
    http::Method::CONNECT,
];

impl RouteTable {
    /// Parses `routes`; an error names the template's index.
    pub(super) fn try_new(routes: &[RouteFile]) -> Result<RouteTable, RouteError> {
        if routes.len() > MAX_ROUTES {
            return Err(RouteError {
                index: MAX_ROUTES,
                reason: format!("at most {MAX_ROUTES} routes per listener"),
            });
        }
        let mut templates = Vec::with_capacity(routes.len());
        for (index, route) in routes.iter().enumerate() {
            let template = parse(route).map_err(|reason| RouteError { index, reason })?;
            if templates.iter().any(|t: &Template| t.name == template.name) {
                return Err(RouteError {
                    index,
                    reason: format!("{:?} is listed twice", template.name),
                });
            }
            templates.push(template);
        }
        Ok(RouteTable {
            templates,
            fallbacks: STANDARD
                .iter()
                .map(|m| (m.clone(), format!("{m} {FALLBACK}")))
                .collect(),
            fallback_other: format!("OTHER {FALLBACK}"),
        })
    }

    /// The route of a request: the first matching template, or the
    /// fallback for its method.
    pub fn route(&self, method: &http::Method, path: &str) -> RouteMatch<'_> {
        let path = path.split('?').next().unwrap_or_default();
        for template in &self.templates {
            if template.method == *method && matches(&template.segments, path) {
                return RouteMatch {
                    name: &template.name,
                    priority: template.priority,
                    repeat: template.repeat,
                };
            }
        }
        let name = self
            .fallbacks
            .iter()
            .find(|(m, _)| m == method)
            .map_or(self.fallback_other.as_str(), |(_, name)| name.as_str());
        RouteMatch {
            name,
            priority: None,
            repeat: Repeat::Method,
        }
    }
}

fn parse(route: &RouteFile) -> Result<Template, String> {
    let text = route.route.trim();
    if text.len() > MAX_TEMPLATE {
        return Err(format!("at most {MAX_TEMPLATE} characters"));
    }
    let (method, path) = text
        .split_once(' ')
        .ok_or_else(|| format!("{text:?} is not METHOD /path (GET /users/{{id}})"))?;
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| format!("{method:?} is not an HTTP method"))?;
    if !path.starts_with('/') || path.contains(char::is_whitespace) || path.contains('?') {
        return Err(format!("{path:?} must be a path from /, no query"));
    }
    let mut segments = Vec::new();
    for part in path.split('/').skip(1) {
        if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
            segments.push(Segment::Any);
        } else if part.contains(['{', '}']) {
            return Err(format!("{part:?}: a variable is a whole segment, {{name}}"));
        } else {
            segments.push(Segment::Literal(part.to_owned()));
        }
    }
    if segments.len() > MAX_SEGMENTS {
        return Err(format!("at most {MAX_SEGMENTS} segments"));
    }
    Ok(Template {
        name: format!("{method} {path}"),
        method,
        segments,
        priority: route.priority.map(PriorityName::priority),
        repeat: route.repeat.unwrap_or(Repeat::Method),
    })
}

fn matches(segments: &[Segment], path: &str) -> bool {
    let mut parts = path.split('/').skip(1);
    for segment in segments {
        match (segment, parts.next()) {
            (Segment::Literal(want), Some(got)) if want == got => {}
            (Segment::Any, Some(got)) if !got.is_empty() => {}
            _ => return false,
        }
    }
    parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(routes: &[&str]) -> RouteTable {
        let files: Vec<RouteFile> = routes
            .iter()
            .map(|r| RouteFile {
                route: (*r).to_owned(),
                priority: None,
                repeat: None,
            })
            .collect();
        RouteTable::try_new(&files).expect("valid routes")
    }

    #[test]
    fn a_template_names_every_request_it_matches() {
        let t = table(&["GET /users/{id}", "POST /users/{id}/orders"]);
        assert_eq!(
            t.route(&http::Method::GET, "/users/42").name,
            "GET /users/{id}"
        );
        assert_eq!(
            t.route(&http::Method::GET, "/users/42?full=1").name,
            "GET /users/{id}"
        );
        assert_eq!(
            t.route(&http::Method::POST, "/users/7/orders").name,
            "POST /users/{id}/orders"
        );
    }

    #[test]
    fn unmatched_requests_share_one_name_per_method() {
        let t = table(&["GET /users/{id}"]);
        let mut names = std::collections::HashSet::new();
        for i in 0..1000 {
            names.insert(
                t.route(&http::Method::GET, &format!("/items/{i}"))
                    .name
                    .to_owned(),
            );
            names.insert(
                t.route(&http::Method::GET, &format!("/users/{i}/x"))
                    .name
                    .to_owned(),
            );
            let odd = http::Method::from_bytes(format!("X{i}").as_bytes()).expect("method");
            names.insert(t.route(&odd, "/users/1").name.to_owned());
        }
        assert_eq!(
            names,
            ["GET other", "OTHER other"].map(String::from).into(),
            "the fallback never puts a path into a scope name"
        );
        assert_eq!(t.route(&http::Method::GET, "/users/").name, "GET other");
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in ["/users", "GET users", "GET /a/{x}y", "GET /a?b", "G\tT /a"] {
            let files = [RouteFile {
                route: bad.into(),
                priority: None,
                repeat: None,
            }];
            assert!(RouteTable::try_new(&files).is_err(), "{bad}");
        }
    }
}
