//! The JSON shapes of the REST calls we use (camelCase, as the service sends them).
//! Fields the service may omit or send as `null` are `Option` or default to empty.

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// `null` and absent both become `T::default()`.
fn null_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `{"count": n, "value": [...]}`
#[derive(Debug, Clone, Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub(crate) struct List<T> {
    #[serde(default = "Vec::new", deserialize_with = "null_vec")]
    pub value: Vec<T>,
}

fn null_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// `GET _apis/connectionData`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionInfo {
    pub authenticated_user: Identity,
    #[serde(default)]
    pub instance_id: Option<String>,
    /// "hosted" (Azure DevOps Services) or "onPremises" (Azure DevOps Server).
    #[serde(default)]
    pub deployment_type: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub provider_display_name: Option<String>,
}

impl ConnectionInfo {
    /// The user the PAT belongs to, for the start-up log line.
    pub fn user(&self) -> &str {
        self.authenticated_user
            .provider_display_name
            .as_deref()
            .or(self.authenticated_user.id.as_deref())
            .unwrap_or("?")
    }
}

/// An agent pool (`GET _apis/distributedtask/pools?poolName=`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub is_hosted: bool,
    /// "automation" or "deployment".
    #[serde(default)]
    pub pool_type: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
}

/// An agent record (`GET .../pools/{id}/agents`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    /// "online" or "offline".
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub created_on: Option<String>,
    #[serde(default)]
    pub status_changed_on: Option<String>,
    /// Only with `includeCapabilities=true`.
    #[serde(default, deserialize_with = "null_default")]
    pub system_capabilities: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_default")]
    pub user_capabilities: BTreeMap<String, String>,
    /// The job it runs now (only with `includeAssignedRequest=true`).
    #[serde(default)]
    pub assigned_request: Option<JobRequest>,
}

impl Agent {
    pub fn is_online(&self) -> bool {
        self.status.eq_ignore_ascii_case("online")
    }
}

/// `{"major":4,"minor":252,"patch":0}`
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PackageVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl std::fmt::Display for PackageVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// One entry of `GET _apis/distributedtask/packages/agent?platform=&top=1`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageInfo {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub platform: Option<String>,
    #[serde(default)]
    pub created_on: Option<String>,
    pub version: PackageVersion,
    pub download_url: String,
    /// MD5 base64 per the spec, SHA-256 hex per the agent's updater (both accepted).
    #[serde(default)]
    pub hash_value: Option<String>,
    #[serde(default)]
    pub info_url: Option<String>,
    #[serde(default)]
    pub filename: Option<String>,
}

/// `{id, name, ...}` reference to an agent in a job request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRef {
    #[serde(default)]
    pub id: Option<u64>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `{name, ...}` of a job request's definition or owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NamedRef {
    #[serde(default)]
    pub id: Option<serde_json::Value>,
    #[serde(default)]
    pub name: Option<String>,
}

/// One entry of `GET .../pools/{id}/jobrequests` (undocumented; the fields KEDA reads).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRequest {
    pub request_id: u64,
    #[serde(default)]
    pub queue_time: Option<String>,
    #[serde(default)]
    pub assign_time: Option<String>,
    #[serde(default)]
    pub receive_time: Option<String>,
    #[serde(default)]
    pub finish_time: Option<String>,
    /// `null` while queued or running; "succeeded", "failed", "canceled"... after.
    #[serde(default)]
    pub result: Option<String>,
    /// Like "cuda_version -equals 12.4" or "Agent.Version -gtVersion 2.182.1".
    #[serde(default, deserialize_with = "null_default")]
    pub demands: Vec<String>,
    #[serde(default)]
    pub reserved_agent: Option<AgentRef>,
    #[serde(default, deserialize_with = "null_default")]
    pub matched_agents: Vec<AgentRef>,
    #[serde(default)]
    pub pool_id: Option<u64>,
    #[serde(default)]
    pub plan_id: Option<String>,
    #[serde(default)]
    pub job_id: Option<String>,
    #[serde(default)]
    pub definition: Option<NamedRef>,
    #[serde(default)]
    pub owner: Option<NamedRef>,
    /// The project the request's plan runs in (its id).
    #[serde(default)]
    pub scope_id: Option<String>,
    /// "Build" for a pipeline run (then `owner.id` is the build's id), "Release"...
    #[serde(default)]
    pub plan_type: Option<String>,
}

/// The fields of `GET {org}/{project}/_apis/build/builds/{id}` that caches' trust reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Build {
    pub id: u64,
    /// `refs/heads/main`, `refs/pull/12/merge`...
    #[serde(default)]
    pub source_branch: Option<String>,
    /// `individualCI`, `batchedCI`, `manual`, `schedule`, `pullRequest`...
    #[serde(default)]
    pub reason: Option<String>,
}

impl JobRequest {
    /// Waiting for an agent: no result and not assigned.
    pub fn is_queued(&self) -> bool {
        self.result.is_none() && self.assign_time.is_none()
    }
    /// Assigned and not finished.
    pub fn is_running(&self) -> bool {
        self.result.is_none() && self.assign_time.is_some() && self.finish_time.is_none()
    }
}
