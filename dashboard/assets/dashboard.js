/*
 * wabarelay dashboard: progressive enhancements only (every page works without
 * script). Loaded from the dashboard's own origin: the page's CSP allows no
 * inline script.
 *  - [data-copy=ID] buttons copy the value of the input with that id;
 *  - forms with [data-confirm] ask before submitting;
 *  - a page restored from the back/forward cache is fetched again;
 *  - an element with [data-live=N] (a running broadcast's progress) is fetched
 *    again every N seconds and replaced in place, until the page served no
 *    longer marks it live (without script, its page has a Refresh link).
 */
(function () {
  'use strict';
  function copy(btn) {
    var input = document.getElementById(btn.getAttribute('data-copy'));
    if (!input) return;
    var label = btn.textContent;
    function done(ok) {
      btn.textContent = ok ? 'Copied' : 'Press Ctrl+C';
      setTimeout(function () { btn.textContent = label; }, 1500);
    }
    input.select();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(input.value).then(function () { done(true); }, function () { done(false); });
    } else {
      var ok = false;
      try { ok = document.execCommand('copy'); } catch (e) { ok = false; }
      done(ok);
    }
  }
  document.addEventListener('click', function (ev) {
    var btn = ev.target.closest && ev.target.closest('button[data-copy]');
    if (btn) { ev.preventDefault(); copy(btn); }
  });
  document.addEventListener('submit', function (ev) {
    var form = ev.target;
    var msg = form.getAttribute && form.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
  function live(el) {
    var secs = parseInt(el.getAttribute('data-live'), 10);
    if (!(secs > 0) || !el.id || !window.fetch || !window.DOMParser) return;
    setTimeout(function poll() {
      // a tab in the background asks nothing (each fetch counts against the key's rate limit)
      if (document.hidden) { setTimeout(poll, secs * 1000); return; }
      fetch(location.href, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
        .then(function (res) { return res.ok ? res.text() : null; })
        .then(function (html) {
          if (html === null) { setTimeout(poll, secs * 4000); return; }
          var doc = new DOMParser().parseFromString(html, 'text/html');
          var fresh = doc.getElementById(el.id);
          if (!fresh) return;
          var cur = document.getElementById(el.id);
          if (!cur) return;
          // keep the focus on a control that is still there (e.g. the Pause button)
          var active = document.activeElement, sel = null;
          if (active && cur.contains(active) && active.closest('form')) sel = active.closest('form').getAttribute('action');
          cur.replaceWith(fresh);
          if (sel) {
            var f = fresh.querySelector('form[action="' + sel + '"] button');
            if (f) f.focus();
          }
          if (fresh.hasAttribute('data-live')) setTimeout(poll, secs * 1000);
        }, function () { setTimeout(poll, secs * 4000); });
    }, secs * 1000);
  }
  document.querySelectorAll('[data-live]').forEach(live);
  // Pages are no-store, yet Chrome restores them from its back/forward cache when
  // no cookie changed while they were cached, and signing out changes the cookie
  // just before: Back would show the ended session's pages (connect links, a
  // secret shown once). Hide a restored page and ask the server again, with a
  // GET (never a resent form).
  window.addEventListener('pageshow', function (ev) {
    if (!ev.persisted) return;
    document.body.hidden = true;
    location.replace(location.href);
  });
})();
