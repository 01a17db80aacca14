/*
 * wabarelay dashboard: progressive enhancements only (every page works without
 * script). Loaded from the dashboard's own origin: the page's CSP allows no
 * inline script.
 *  - [data-copy=ID] buttons copy the value of the input with that id;
 *  - forms with [data-confirm] ask before submitting;
 *  - a page restored from the back/forward cache is fetched again.
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
